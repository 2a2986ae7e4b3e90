"""`init()`, `shutdown()` and re-joining after a membership change, and the queries about this
worker's place in the job."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import torch.distributed as dist

from elastic.worker import context
from elastic.worker.collectives.process_sets import add_process_set, clear_process_sets
from elastic.worker.config import WorkerConfig
from elastic.worker.driver_link.control_client import ControlClient, ControlError
from elastic.worker.driver_link.http_client import DriverClient, NotMemberError
from elastic.worker.driver_link.membership_events import MembershipEvents, Offer
from elastic.worker.errors import WorkerLostError
from elastic.worker.group.formation import InitTimeoutError, enter_next_round, form_again
from elastic.worker.group.gloo_interface import choose_gloo_interface, source_address
from elastic.worker.group.process_group import abandon_group
from elastic.worker.group.reachability import PeerWatch, ProbeResponder
from elastic.worker.preemption import PreemptionWatch

log = logging.getLogger(__name__)


def init(comm: Any = None, process_sets: Sequence[Any] | None = None) -> None:
    """Join the rendezvous and form the process group. Calling it again does nothing.
    `process_sets` (Horovod's static process sets) are added once the group is formed;
    `comm` (an MPI communicator or rank list in Horovod) raises `NotImplementedError`.
    On return `os.environ` holds this worker's rank variables (`publish_slot`), a worker that
    joined a running job included.

    Raises `NotLaunchedError` when the process was not started by `elasticrun` and
    `DriverError` when no round with this worker forms within the start timeout. A worker
    the driver excluded before it joined (its host left the job, the job is ending, it got
    SIGTERM) ends with `SystemExit(0)`. In an elastic job, SIGTERM from here on makes the
    worker leave at its next commit (`leave_on_sigterm`). Unless the user set
    `GLOO_SOCKET_IFNAME`, it is set to the interface that reaches the driver, so ranks on
    other hosts can connect (`gloo_interface`).

    After `shutdown()` it takes this worker's membership up again (`_resume`): the round
    the driver moved on to meanwhile, else a new group in the same round, which every rank
    reaches by calling `init()` as often as the others; `InitTimeoutError` when some rank
    does not call it within `--start-timeout`.
    """
    if comm is not None:
        raise NotImplementedError(
            "hvd.init(comm=...) is not offered: elasticrun forms the group from its own "
            "rendezvous, without MPI; limit collectives to some ranks with process sets "
            "(hvd.init(process_sets=[...]) or hvd.add_process_set)"
        )
    if context.is_initialized():
        return
    if (dormant := context.process_wide().dormant) is not None:
        _resume(dormant)
    else:
        _start()
    for process_set in process_sets or ():
        add_process_set(process_set)


def _start() -> None:
    """The process's first `init()`: connect to the driver, enter the first round."""
    config = WorkerConfig.from_env()
    driver_host = urlsplit(config.driver_url).hostname
    if driver_host:
        choose_gloo_interface(driver_host)  # before any group: see group/gloo_interface.py
    client = DriverClient.for_worker(config)
    locator = client.locator
    events = MembershipEvents()
    control = ControlClient(
        config.control_address,
        config.token,
        config.worker_id,
        events,
        retry_for=config.driver_retry_for,
        tls_cert=config.tls_cert,
        locator=locator,
        activity=context.process_wide().progress.activity,
    )
    control.start()
    _say_exiting_first(control)
    # Probes come to the address that reaches the driver, as Gloo's connections do.
    address = (source_address(driver_host) if driver_host else None) or "127.0.0.1"
    peers = PeerWatch(ProbeResponder(address), control.report_unreachable)
    if config.elastic:
        _leave_on_sigterm(events, control)
        _watch_for_preemption(config, events, control)
        _warm_up()
    if config.slot is not None:  # one of the job's first workers: round 1 formed before launch
        events.offer(Offer(1, config.slot))
    try:
        enter_next_round(config, client, control, events, peers, 0, config.start_timeout)
    except NotMemberError:
        _close(control, client, peers)
        log.info("this worker leaves the job before it joined")
        raise SystemExit(0) from None
    except BaseException:
        control.close()
        client.close()
        peers.close()
        raise


def _resume(dormant: context.WorkerContext) -> None:
    """`init()` after `shutdown()`. The worker is still a member of the job (`dormant` holds
    its driver connections and events): it enters the round the driver formed, broke or
    announced meanwhile (a peer died or left, a host came, this worker was asked to leave),
    else forms a new group in the round it left (`form_again`). A worker the driver
    excluded meanwhile (the job ends because a peer finished, its host left) ends with
    `SystemExit(0)`, as at a first `init()`."""
    config, client, control, peers = dormant.config, dormant.client, dormant.control, dormant.peers
    assert config is not None and client is not None and control is not None, "set by init()"
    assert peers is not None, "set by init()"
    events, number = dormant.events, dormant.round
    try:
        if _moved_on(events, number):
            _say_leaving_again(events, control)
            enter_next_round(config, client, control, events, peers, number, config.rejoin_timeout)
        else:
            form_again(dormant)
    except NotMemberError:
        context.process_wide().dormant = None
        _close(control, client, peers)
        log.warning(
            "hvd.init(): the driver let this worker go while it was shut down (the job is "
            "ending, or its host left the job): it leaves the job"
        )
        raise SystemExit(0) from None
    context.process_wide().dormant = None


def _moved_on(events: MembershipEvents, number: int) -> bool:
    """Whether the driver has said anything that ends round `number` for this worker."""
    return (
        events.pending_update(number) is not None
        or events.broken(number) is not None
        or events.offer_after(number) is not None
        or events.leaving
    )


def _say_exiting_first(control: ControlClient) -> None:
    """At interpreter exit, tell the driver first, before anything slow: the hook runs before
    non-daemon threads are joined and before every `atexit` handler (the user's, those that
    flush or join). A script that returned has finished; one that ended on an uncaught
    exception is exiting with an error."""

    def say() -> None:
        failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        control.say_exiting(finished=failed is None)

    threading._register_atexit(say)  # type: ignore[attr-defined]  # private, since 3.9


def leave_on_sigterm() -> None:
    """Make SIGTERM (a spot reclaim, a Kubernetes eviction) mean: leave the job at the next
    commit; the others go on without this worker, nothing is rolled back, its host is not
    cooled down. Works at any point of the worker's life, a re-form included. Only from the
    main thread (elsewhere it does nothing)."""
    ctx = context.current("hvd.elastic.run")
    assert ctx.control is not None, "init() gives every context its control client"
    _leave_on_sigterm(ctx.events, ctx.control)


def _leave_on_sigterm(events: MembershipEvents, control: ControlClient) -> None:
    def leave(signum: int, frame: Any) -> None:
        events.request_leave(SIGTERM_REASON)
        threading.Thread(target=_ask_to_leave, args=(control,), daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, leave)


SIGTERM_REASON = "SIGTERM"


def _watch_for_preemption(
    config: WorkerConfig, events: MembershipEvents, control: ControlClient
) -> None:
    """With `--preemption-check`: run it every interval; when it prints a time, this worker
    leaves at its next step (as on SIGTERM) and the driver lets the host's other workers go
    and launches none there before that time. The check stops when the worker's control
    client closes (it exits, or the driver excluded it); `shutdown()` does not stop it."""
    if not config.preemption_check:
        return

    def noticed(at: float) -> None:
        log.warning("this host goes at %s (its preemption check): leaving the job", at)
        events.request_leave(f"its host goes at {at} (its preemption check)")
        control.notice(at)

    PreemptionWatch(
        config.preemption_check, config.preemption_check_interval, noticed, control.closed
    ).start()


def _ask_to_leave(control: ControlClient) -> None:
    try:
        control.leave(SIGTERM_REASON)
    except ControlError as err:  # the driver stops this worker already, or is gone; said again
        log.debug("the driver did not take the leave request: %s", err)  # at the re-form


def _warm_up() -> None:
    """Pay torch's lazy start-up costs before joining: the first optimizer built in a process
    imports `torch._dynamo` (1.5 s on a small machine). A worker joining a running job does
    this before the incumbents are interrupted for it, so they stall for a re-form and a state
    sync, not for the joiner's imports."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def rejoin() -> None:
    """Leave the current round's group and join the next round (the elastic run loop's step
    after `WorkerLostError` or `HostsUpdatedInterrupt`).

    The old group is abandoned, not destroyed: one of its collectives may still be blocked on
    a dead peer. Raises `NotMemberError` when the driver excluded this worker (it leaves the
    job), `DriverError` when no round with it forms within the start timeout.
    """
    ctx = context.current("hvd.elastic reset")
    config, client, control, peers = ctx.config, ctx.client, ctx.control, ctx.peers
    assert config is not None and client is not None and control is not None, "set by init()"
    assert peers is not None, "set by init()"
    abandon_group()
    context.activate(None)
    _say_leaving_again(ctx.events, control)
    try:
        enter_next_round(
            config, client, control, ctx.events, peers, ctx.round, config.rejoin_timeout
        )
    except NotMemberError:
        _close(control, client, peers)
        raise


def _say_leaving_again(events: MembershipEvents, control: ControlClient) -> None:
    """Before re-joining, say again why this worker wants to leave, if it does: the first
    word (a Leave or Notice call) may have been lost, and then the driver would take this
    worker into the next round, where it interrupts again."""
    if (reason := events.leave_reason) is None:
        return
    try:
        control.leave(reason)
    except ControlError as err:
        log.warning("could not ask the driver to let this worker go: %s", err)


def shutdown() -> None:
    """Release the process group and forget the process sets (`clear_process_sets`):
    `is_initialized()` is False, and every collective and query raises
    `NotInitializedError`, until the next `init()`. Idempotent; does nothing before `init()`.

    The worker stays a member of the job and the driver is told nothing: its driver
    connections, heartbeats and event stream are kept (`ProcessWide.dormant`), so a later
    `init()` in this process takes its place again, in the same round or the one the driver
    formed meanwhile. The driver hears that the worker finished (or failed) when its
    interpreter exits (`_say_exiting_first`), as for a script that never calls `shutdown()`.
    A group whose round is broken, or with a call still in flight, is abandoned rather than
    destroyed (`abandon_group`): a collective may still be blocked on a dead peer.
    """
    if not context.is_initialized():
        return
    ctx = context.current()
    blocked = bool(ctx.in_flight) or ctx.events.broken(ctx.round) is not None
    clear_process_sets(keep_groups_alive=blocked)
    if blocked:
        abandon_group()
    elif dist.is_initialized():
        dist.destroy_process_group()
    context.activate(None)
    if ctx.control is not None:  # none in a context made by hand (no driver)
        context.process_wide().dormant = ctx


def _close(control: ControlClient, client: DriverClient, peers: PeerWatch | None) -> None:
    """Tell the driver this worker exits (its stream closing is no death), then disconnect:
    the driver excluded it. Called while an exception propagates, the exit is not a finish."""
    control.say_exiting(finished=sys.exc_info()[0] is None)
    control.close()
    client.close()
    if peers is not None:
        peers.close()


def is_initialized() -> bool:
    return context.is_initialized()


def rank() -> int:
    """This worker's rank in the current round (0..size-1)."""
    return context.current("hvd.rank()").slot.rank


def size() -> int:
    """Number of workers in the current round."""
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
    "InitTimeoutError",
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
