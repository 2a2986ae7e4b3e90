"""The control service's calls, answered from the workers' records and reported to the job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import ControlEvent
from elastic.driver.reports import (
    DurableStale,
    Heard,
    HostNoticed,
    LeaveAsked,
    PeersUnreachable,
    Reports,
)
from elastic.driver.workers import Worker
from elastic.protocol.beats import Activity


class WorkerInputs:
    """The driver's `WorkerListener`: answers whether a worker is a live one of the job.

    It keeps the facts of liveness itself (registered, pid, last heartbeat, stream closed
    since) on the workers' records; what needs a decision (a new commit count or a newer
    round in a heartbeat, a leave) goes to `reports`. `current_round` is the driver's newest
    round: a heartbeat from a newer one is reported (an earlier driver formed it unsaved).
    A heartbeat's activity goes on the worker's `progress`; a first step in the current round
    is told to `first_step(round, when)` (the driver's monotonic clock).
    """

    def __init__(
        self,
        workers: Mapping[str, Worker],
        channels: ControlChannels,
        reports: Reports,
        current_round: Callable[[], int],
        clock: Callable[[], float],
        first_step: Callable[[int, float], None] = lambda round_, at: None,
    ) -> None:
        self._workers = workers
        self._channels = channels
        self._reports = reports
        self._current_round = current_round
        self._clock = clock
        self._first_step = first_step

    def _live(self, worker_id: str) -> Worker | None:
        worker = self._workers.get(worker_id)
        return worker if worker is not None and worker.state.alive else None

    def registered(self, worker_id: str, pid: int) -> bool:
        worker = self._live(worker_id)
        if worker is None:
            return False
        worker.registered = True
        worker.pid = pid
        worker.last_heartbeat = self._clock()
        if worker.registered_at is None:  # a retried Register does not lengthen its excuse
            worker.registered_at = worker.last_heartbeat
        return True

    def heartbeat(
        self,
        worker_id: str,
        round: int,
        commit: int,
        durable: int = 0,
        stale: bool = False,
        activity: Activity | None = None,
    ) -> bool:
        worker = self._live(worker_id)
        if worker is None:
            return False
        now = worker.last_heartbeat = self._clock()
        if activity is not None:
            worker.progress.heard(activity, round, now)
            if activity.first_step_age >= 0 and round == self._current_round():
                self._first_step(round, now - activity.first_step_age)
        worker.heard = True
        worker.durable = durable
        if stale != worker.durable_stale:
            worker.durable_stale = stale
            self._reports.put_nowait(DurableStale(worker_id, stale, durable))
        if round and not worker.joined:
            # In a round without an HTTP join: its slot came with its launch or on its stream.
            worker.joined = True
        if commit != worker.commit or round > self._current_round():
            self._reports.put_nowait(Heard(worker_id, round, commit))
        return True

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        if self._live(worker_id) is None:
            return False
        self._reports.put_nowait(LeaveAsked(worker_id, reason, commit))
        return True

    def unreachable(self, worker_id: str, round: int, ranks: frozenset[int]) -> bool:
        if self._live(worker_id) is None:
            return False
        if ranks:
            self._reports.put_nowait(PeersUnreachable(worker_id, round, ranks))
        return True

    def notice(self, worker_id: str, leaving_at: float) -> bool:
        worker = self._live(worker_id)
        if worker is None:
            return False
        self._reports.put_nowait(HostNoticed(worker.hostname, leaving_at))
        return True

    def stream_opened(self, worker_id: str) -> asyncio.Queue[ControlEvent] | None:
        worker = self._live(worker_id)
        if worker is None:
            return None
        worker.stream_closed_at = None
        return self._channels.open(worker_id)

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[ControlEvent]) -> None:
        if not self._channels.close(worker_id, queue):
            return  # an older stream of a worker that has reconnected since
        worker = self._live(worker_id)
        if worker is not None:
            worker.stream_closed_at = self._clock()
