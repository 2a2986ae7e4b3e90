"""The job's rounds, newest last: when each formed, how big, why, and how long recovery took.

Recovery is measured on the driver's clock in two legs: from the failure noticed (the
decision that a member died) to the next round formed, and from a round formed to its first
step (the earliest first step its members' heartbeats report, dated by its age in the beat).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from elastic.protocol.http import RoundRecord

ROUNDS_KEPT = 100

# The legs `on_recovery` is told of, by name.
NOTICED_TO_FORMED = "noticed_to_formed"
FORMED_TO_FIRST_STEP = "formed_to_first_step"
NOTICED_TO_FIRST_STEP = "noticed_to_first_step"


@dataclass
class _Round:
    number: int
    formed_at: float  # Unix seconds
    formed: float  # the driver's monotonic clock
    size: int
    cause: str
    reason: str
    noticed: float | None  # the failure that led to it, monotonic
    first_step: float | None = None  # monotonic

    def record(self) -> RoundRecord:
        return RoundRecord(
            number=self.number,
            formed_at=self.formed_at,
            size=self.size,
            cause=self.cause,
            reason=self.reason,
            noticed_to_formed=self.formed - self.noticed if self.noticed is not None else None,
            formed_to_first_step=(
                self.first_step - self.formed if self.first_step is not None else None
            ),
        )


class RoundTimeline:
    """The newest `ROUNDS_KEPT` rounds, and re-forms counted by cause for the job's life.

    `on_recovery(leg, seconds)` is told each measured leg once (see the module's names);
    `clock` is monotonic time, `wall` Unix time."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_recovery: Callable[[str, float], None] = lambda leg, seconds: None,
    ) -> None:
        self._clock, self._wall, self._on_recovery = clock, wall, on_recovery
        self._rounds: deque[_Round] = deque(maxlen=ROUNDS_KEPT)
        self._noticed: float | None = None  # the first failure since the last round formed
        self.reforms: Counter[str] = Counter()  # by cause; the first round is no re-form

    def noticed(self) -> None:
        """A member's failure was noticed now; the next round's recovery counts from the
        first such notice since the last round formed."""
        if self._noticed is None:
            self._noticed = self._clock()

    def formed(self, number: int, size: int, cause: str, reason: str) -> None:
        """Round `number` formed now with `size` members, for `cause` (`reason`: in words)."""
        now = self._clock()
        noticed, self._noticed = self._noticed, None
        if self._rounds or number > 1:
            self.reforms[cause] += 1
        self._rounds.append(_Round(number, self._wall(), now, size, cause, reason, noticed))
        if noticed is not None:
            self._on_recovery(NOTICED_TO_FORMED, now - noticed)

    def first_step(self, number: int, at: float) -> None:
        """A member of round `number` took its first step in it at `at` (monotonic); the
        round's first step is the earliest one told while it is the newest round."""
        if not self._rounds or self._rounds[-1].number != number:
            return
        newest = self._rounds[-1]
        at = max(at, newest.formed)  # a beat's age rounds; a step cannot precede its round
        if newest.first_step is not None and newest.first_step <= at:
            return
        first = newest.first_step is None
        newest.first_step = at
        if first:
            self._on_recovery(FORMED_TO_FIRST_STEP, at - newest.formed)
            if newest.noticed is not None:
                self._on_recovery(NOTICED_TO_FIRST_STEP, at - newest.noticed)

    def records(self) -> list[RoundRecord]:
        """The kept rounds, oldest first."""
        return [entry.record() for entry in self._rounds]
