"""Which live workers must be acted on, from their records and the time. Pure, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from elastic.driver.workers import Worker, WorkerState

MISSED_HEARTBEATS = 3


class Verdict(enum.Enum):
    HUNG = f"missed {MISSED_HEARTBEATS} heartbeats (hung?)"
    STREAM_CLOSED = "closed its control stream"
    NOT_JOINED = "did not join the rendezvous in time"
    LINGERING = "left the job but has not exited"


@dataclass(frozen=True)
class Limits:
    heartbeat_interval: float
    stop_grace: float  # how long a closing or leaving worker may take to exit
    start_timeout: float  # how long a started worker may take to join


def judge(workers: Iterable[Worker], now: float, limits: Limits) -> list[tuple[Worker, Verdict]]:
    """The live workers to act on, each with one verdict.

    A registered worker, one whose heartbeats reached this driver (it may beat before its
    event stream registers, as after a driver restart), or one that joined a round (it
    registered before it joined, maybe with an earlier driver whose record of it was not
    saved), is HUNG after `MISSED_HEARTBEATS` heartbeat intervals without one. A
    worker whose control stream closed without it saying it exits is STREAM_CLOSED after
    `max(heartbeat_interval, stop_grace)`: a crashing worker closes its stream first and takes
    a while to exit, and its exit code says more. A worker that has not joined a round within
    the start timeout is NOT_JOINED, unless it waits at the rendezvous (then the driver, not
    the worker, is why no round includes it yet). A worker that left the job (it is no member)
    but still runs `stop_grace` after closing its stream is LINGERING, and HUNG when it misses
    heartbeats before that (it may still be in a collective of an older round). A leaving
    worker still `handing_over` its state is judged like a member. Exiting workers are left
    alone.
    """
    interval = limits.heartbeat_interval
    verdicts = []
    for worker in workers:
        if not worker.state.alive or worker.process is None:
            continue
        closed_for = now - worker.stream_closed_at if worker.stream_closed_at is not None else None
        heard_of = worker.registered or worker.heard or worker.joined  # else none is due yet
        hung = heard_of and now - worker.last_heartbeat > MISSED_HEARTBEATS * interval
        if worker.state is WorkerState.LEAVING and not worker.handing_over:
            if closed_for is not None and closed_for > limits.stop_grace:
                verdicts.append((worker, Verdict.LINGERING))
            elif hung and closed_for is None:
                verdicts.append((worker, Verdict.HUNG))  # its peers may be blocked on it
        elif worker.exiting:
            continue
        elif hung:
            verdicts.append((worker, Verdict.HUNG))
        elif closed_for is not None and closed_for > max(interval, limits.stop_grace):
            verdicts.append((worker, Verdict.STREAM_CLOSED))
        elif (
            not worker.joined
            and worker.waiting_since is None
            and now - worker.launched_at > limits.start_timeout
        ):
            verdicts.append((worker, Verdict.NOT_JOINED))
    return verdicts


class Ending(enum.Enum):
    """What a worker's exit means for the job."""

    IGNORED = "ignored"  # it was stopped, or had ended for the driver already
    LEFT = "left"  # it had left the job: its slot is free
    LEFT_UNSEEN = "left unseen"  # exited 0 unwatched, never said it finished: it left
    FINISHED = "finished"  # exited 0: a member's end is the end of training
    CANNOT_RUN = "cannot run"  # 126/127 before registering: the command cannot run
    FAILED = "failed"  # died or exited non-zero


def ending(worker: Worker, ended_unwatched: bool) -> Ending:
    """What `worker`'s exit (its `exit_code`) means; `ended_unwatched`: it ended while no
    driver watched it (between a driver's death and its successor's adoption)."""
    code = worker.exit_code
    if worker.state is WorkerState.STOPPED or not worker.state.alive:
        return Ending.IGNORED
    if worker.state is WorkerState.LEAVING and not worker.handing_over:
        return Ending.LEFT
    if code == 0:
        return Ending.LEFT_UNSEEN if ended_unwatched and not worker.exiting else Ending.FINISHED
    if code in (126, 127) and not worker.registered:
        return Ending.CANNOT_RUN
    return Ending.FAILED
