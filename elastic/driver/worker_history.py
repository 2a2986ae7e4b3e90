"""The ended workers a driver remembers: the newest few whole, every one as a count by cause.

A job on spot hosts that runs for weeks replaces tens of thousands of workers. The driver
keeps the record of every live worker, of the newest `kept` ended ones (--worker-history) and
of ended members of the current round (the policy reads those until the next round forms);
each other ended record is dropped and counted, by state and by cause (`policy.end_causes`).
So a status, a page refresh, a liveness look and a saved job state each walk a number of
records bounded by the live workers plus `kept`, however many workers came and went.

A dropped worker's process has ended: nothing is kept for it anywhere (its control channel,
its exclusion from the rendezvous: the control service refuses an id it does not know with
NOT_FOUND, which makes a worker leave, as an ended one's is refused).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field

from elastic.driver.policy.end_causes import end_cause
from elastic.driver.settings import DEFAULT_WORKER_HISTORY
from elastic.driver.workers import Worker


@dataclass
class EndedCounts:
    """How many workers ended, by state (exited, failed, stopped) and by cause."""

    by_state: Counter[str] = field(default_factory=Counter)
    by_cause: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    def add(self, worker: Worker) -> None:
        """Count the ended `worker`."""
        self.by_state[worker.state.value] += 1
        self.by_cause[end_cause(worker)] += 1

    def plus(self, workers: Iterable[Worker]) -> EndedCounts:
        """These counts with the ended ones of `workers` (no longer alive for the job: those
        stopped and still being killed among them) added, as a new object."""
        both = EndedCounts(Counter(self.by_state), Counter(self.by_cause))
        for worker in workers:
            if not worker.state.alive:
                both.add(worker)
        return both


def has_ended(worker: Worker) -> bool:
    """Whether `worker` has ended for good: no longer alive for the job, and its process
    (if it ever had one) seen to end."""
    return not worker.state.alive and (worker.process is None or worker.exit_code is not None)


class WorkerHistory:
    """Bounds `workers` (the fleet's records, by id, in launch order), counting what it drops.

    `retire` is called after each change that can end a worker or free an ended member
    (a worker's exit, a round formed); it never drops a live worker, one whose process has
    not been seen to end (stopped, being killed) or one named in `in_use`.
    """

    def __init__(
        self, workers: MutableMapping[str, Worker], kept: int = DEFAULT_WORKER_HISTORY
    ) -> None:
        self._workers = workers
        self.kept = kept
        self.dropped = EndedCounts()  # the workers whose records were dropped
        self.most_steps = 0  # the most optimizer steps a dropped worker took (this driver saw)

    def retire(self, in_use: Container[str]) -> list[Worker]:
        """Drop the records of ended workers past the newest `kept` (by when their end was
        seen; the oldest launched first among equals), but those `in_use`; return them."""
        ended = [w for w in self._workers.values() if has_ended(w) and w.worker_id not in in_use]
        if len(ended) <= self.kept:
            return []
        ended.sort(key=lambda w: w.ended_at if w.ended_at is not None else float("-inf"))
        gone = ended[: len(ended) - self.kept]
        for worker in gone:
            del self._workers[worker.worker_id]
            self.dropped.add(worker)
            if (activity := worker.progress.activity) is not None:
                self.most_steps = max(self.most_steps, activity.steps)
        return gone

    def counts(self) -> EndedCounts:
        """Every worker that ended: those dropped and those still kept."""
        return self.dropped.plus(self._workers.values())

    def restore(self, by_state: Mapping[str, int], by_cause: Mapping[str, int]) -> None:
        """Take up the dropped workers' counts an earlier driver of the job saved."""
        self.dropped = EndedCounts(Counter(by_state), Counter(by_cause))
