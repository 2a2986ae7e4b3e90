"""`init()`, `shutdown()` and re-joining after a membership change, and the queries about this
worker's place in the job."""

from __future__ import annotations

import logging
from datetime import timedelta

import torch.distributed as dist

from elastic.worker import context
from elastic.worker.client import DriverClient, EpochSuperseded, NotMemberError
from elastic.worker.config import WorkerConfig
from elastic.worker.control import ControlClient
from elastic.worker.errors import WorkerLostError
from elastic.worker.locator import DriverLocator
from elastic.worker.membership import MembershipEvents
from elastic.worker.process_group import abandon_group, create_group, device_for
from elastic.worker.store import DriverStore

log = logging.getLogger(__name__)


def init() -> None:
    """Join the rendezvous and form the process group. Calling it again does nothing.

    Raises `NotLaunchedError` when the process was not started by `elasticrun`,
    `DriverError` when no epoch with this worker forms within the start timeout, and
    `NotMemberError` when the driver excluded the worker before it joined.
    """
    if context.is_initialized():
        return
    config = WorkerConfig.from_env()
    locator = DriverLocator(
        config.driver_url,
        config.control_address,
        config.etcd,
        config.job_id,
        token=config.token,  # verifies the certificate a restarted driver publishes (TLS)
        tls_cert=config.tls_cert,
    )
    client = DriverClient(
        config.driver_url,
        config.token,
        retry_for=config.driver_retry_for,
        tls_cert=config.tls_cert,
        locator=locator,
    )
    events = MembershipEvents()
    control = ControlClient(
        config.control_address,
        config.token,
        config.worker_id,
        events,
        retry_for=config.driver_retry_for,
        tls_cert=config.tls_cert,
        locator=locator,
    )
    control.start()
    if config.elastic:
        _warm_up()
    try:
        _enter_next_epoch(config, client, control, events, after_epoch=0)
    except BaseException:
        control.close()
        client.close()
        raise


def _warm_up() -> None:
    """Pay torch's lazy start-up costs before joining: the first optimizer built in a process
    imports `torch._dynamo` (1.5 s on a small machine). A worker joining a running job does
    this before the incumbents are interrupted for it, so they stall for a re-form and a state
    sync, not for the joiner's imports."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _enter_next_epoch(
    config: WorkerConfig,
    client: DriverClient,
    control: ControlClient,
    events: MembershipEvents,
    after_epoch: int,
) -> None:
    """Join the first epoch after `after_epoch` and form its process group.

    A newer epoch forming while the group forms (a peer died meanwhile) makes it join again.
    """
    timeout = timedelta(seconds=config.collective_timeout)
    while True:
        epoch, slot = client.join(config.worker_id, after_epoch, config.start_timeout)
        control.set_epoch(epoch)
        store = DriverStore(client, epoch, timeout)
        device = device_for(slot.local_rank)
        try:
            group = create_group(store, slot.rank, slot.size, device, timeout)
        except EpochSuperseded:
            after_epoch = epoch
            continue
        context.activate(
            context.WorkerContext(
                slot=slot,
                epoch=epoch,
                group=group,
                device=device,
                events=events,
                timeout=config.collective_timeout,
                resources=[config, client, control],
                on_commit=control.set_commit,
            )
        )
        return


def rejoin() -> None:
    """Leave the current epoch's group and join the next epoch (the elastic run loop's step
    after `WorkerLostError` or `HostsUpdatedInterrupt`).

    The old group is abandoned, not destroyed: one of its collectives may still be blocked on
    a dead peer. Raises `NotMemberError` when the driver excluded this worker (it leaves the
    job), `DriverError` when no epoch with it forms within the start timeout.
    """
    ctx = context.current("hvd.elastic reset")
    config, client, control = ctx.resources
    abandon_group()
    context.activate(None)
    try:
        _enter_next_epoch(config, client, control, ctx.events, after_epoch=ctx.epoch)
    except NotMemberError:
        _close(control, client)
        raise


def shutdown() -> None:
    """Leave the job: release the process group and the driver connections. Idempotent."""
    if not context.is_initialized():
        return
    ctx = context.current()
    _, client, control = ctx.resources
    if dist.is_initialized():
        dist.destroy_process_group()
    _close(control, client)
    context.activate(None)


def _close(control: ControlClient, client: DriverClient) -> None:
    """Tell the driver this worker exits (its stream closing is no death), then disconnect."""
    try:
        control.leave("exit")
    except Exception as err:  # the driver may be gone already: nothing to tell it then
        log.debug("could not tell the driver this worker exits: %s", err)
    control.close()
    client.close()


def is_initialized() -> bool:
    return context.is_initialized()


def rank() -> int:
    """This worker's rank in the current epoch (0..size-1)."""
    return context.current("hvd.rank()").slot.rank


def size() -> int:
    """Number of workers in the current epoch."""
    return context.current("hvd.size()").slot.size


def local_rank() -> int:
    """This worker's index among the workers on its host."""
    return context.current("hvd.local_rank()").slot.local_rank


def local_size() -> int:
    """Number of workers on this worker's host."""
    return context.current("hvd.local_size()").slot.local_size


def cross_rank() -> int:
    """This host's index among the hosts that have a worker with this local rank."""
    return context.current("hvd.cross_rank()").slot.cross_rank


def cross_size() -> int:
    """Number of hosts that have a worker with this local rank."""
    return context.current("hvd.cross_size()").slot.cross_size


__all__ = [
    "WorkerLostError",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "rejoin",
    "shutdown",
    "size",
]
