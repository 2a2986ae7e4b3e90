"""What this worker process is doing, for its heartbeats: steps, samples, commits, and the
collective it issued last and whether it is blocked in it.

The training thread writes (a few attribute writes per call: no lock, each write is atomic
under the GIL); the heartbeat thread reads a snapshot (`activity`). Collectives are counted
per round, in the order the training script issues them, so the same collective has the same
number on every rank: the driver finds the ranks that are not where the others wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from elastic.protocol.beats import Activity


class Progress:
    """One process's counters; `clock` is monotonic time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.steps = 0
        self.samples = 0
        self._first_step: float | None = None  # in the current round
        self._committed: float | None = None
        self._written: float | None = None
        self._seq = 0
        self._kind = ""
        self._blocked_since: float | None = None

    def new_round(self) -> None:
        """A round began: its collectives are counted from 1, its first step is to come."""
        self._seq, self._kind = 0, ""
        self._first_step = None
        self._blocked_since = None

    def issued(self, kind: str) -> None:
        """The training script issued a collective of `kind` (every rank issues the same)."""
        self._seq += 1
        self._kind = kind

    def blocked(self) -> None:
        """This process waits for its collective now (the first call of a wait counts)."""
        if self._blocked_since is None:
            self._blocked_since = self._clock()

    def unblocked(self) -> None:
        self._blocked_since = None

    def stepped(self) -> None:
        """An optimizer step completed."""
        self.steps += 1
        if self._first_step is None:
            self._first_step = self._clock()

    def counted(self, samples: int) -> None:
        """`samples` more samples were processed (as the ElasticSampler records them)."""
        self.samples += samples

    def committed(self) -> None:
        self._committed = self._clock()

    def wrote_durably(self) -> None:
        self._written = self._clock()

    def activity(self) -> Activity:
        """A snapshot for a heartbeat; ages are seconds before now."""
        now = self._clock()

        def age(since: float | None) -> float:
            return now - since if since is not None else -1.0

        return Activity(
            steps=self.steps,
            samples=self.samples,
            first_step_age=age(self._first_step),
            commit_age=age(self._committed),
            durable_age=age(self._written),
            seq=self._seq,
            kind=self._kind,
            blocked_for=age(self._blocked_since),
        )
