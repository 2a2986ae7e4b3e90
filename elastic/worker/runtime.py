"""`init()` and `shutdown()`, and the queries about this worker's place in the job."""

from __future__ import annotations

import os
from datetime import timedelta

from elastic.worker import context
from elastic.worker.client import DriverClient
from elastic.worker.config import WorkerConfig
from elastic.worker.process_group import create_group, destroy_group, device_for
from elastic.worker.store import DriverStore


def init() -> None:
    """Join the rendezvous and form the process group. Calling it again does nothing.

    Raises `NotLaunchedError` when the process was not started by `elasticrun`, and
    `DriverError` when no epoch with this worker's slot forms within the start timeout.
    """
    if context.is_initialized():
        return
    config = WorkerConfig.from_env()
    client = DriverClient(config.driver_url, config.token, retry_for=config.start_timeout)
    epoch, slot = client.join(config.hostname, config.local_rank, os.getpid(), config.start_timeout)
    timeout = timedelta(seconds=config.collective_timeout)
    store = DriverStore(client, epoch, timeout)
    device = device_for(slot.local_rank)
    group = create_group(store, slot.rank, slot.size, device, timeout)
    context.activate(
        context.WorkerContext(
            slot=slot, epoch=epoch, group=group, device=device, resources=[client, store]
        )
    )


def shutdown() -> None:
    """Leave the job: release the process group and the driver connection. Idempotent."""
    if not context.is_initialized():
        return
    ctx = context.current()
    destroy_group()
    for resource in ctx.resources:
        if isinstance(resource, DriverClient):
            resource.close()
    context.activate(None)


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
