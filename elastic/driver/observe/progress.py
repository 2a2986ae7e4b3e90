"""A worker's progress as its heartbeats say: steps, samples, commit ages, its collective.

Ages arrive measured by the worker's clock at its beat; the driver adds the time since it
received the beat, so no two hosts' clocks need to agree.
"""

from __future__ import annotations

import math
from collections import deque

from elastic.protocol.beats import Activity
from elastic.protocol.http import CollectiveStatus

RATE_WINDOW = 10.0  # seconds of heartbeats a rate is measured over


def _age(value: float) -> float | None:
    """A beat's age field: None when negative (none) or not a finite number."""
    return value if math.isfinite(value) and value >= 0 else None


class WorkerProgress:
    """The newest `Activity` a worker's heartbeats carried, in round `round`, received at `at`
    (the driver's monotonic clock), and its step and sample rates over the last
    `RATE_WINDOW` seconds."""

    __slots__ = ("activity", "round", "at", "_points")

    def __init__(self) -> None:
        self.activity: Activity | None = None
        self.round = 0
        self.at = 0.0
        self._points: deque[tuple[float, int, int]] = deque()  # (at, steps, samples)

    def heard(self, activity: Activity, round_: int, now: float) -> None:
        """A heartbeat from round `round_` carried `activity`, at `now` (a step count that
        went down starts the rates afresh)."""
        points = self._points
        if points and activity.steps < points[-1][1]:
            points.clear()
        points.append((now, activity.steps, activity.samples))
        while len(points) > 2 and points[1][0] <= now - RATE_WINDOW:
            points.popleft()
        self.activity, self.round, self.at = activity, round_, now

    def _rate(self, index: int) -> float | None:
        points = self._points
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            return None
        return (points[-1][index] - points[0][index]) / (points[-1][0] - points[0][0])

    @property
    def step_rate(self) -> float | None:
        """Optimizer steps per second lately; None until two beats were heard."""
        return self._rate(1)

    @property
    def sample_rate(self) -> float | None:
        """Samples per second lately, as the worker's ElasticSampler records them."""
        return self._rate(2)

    def age(self, beat_age: float, now: float) -> float | None:
        """An age the last beat carried (`activity.commit_age`, say), as of `now`."""
        value = _age(beat_age)
        return value + (now - self.at) if value is not None else None

    def collective(self, now: float) -> CollectiveStatus | None:
        """The collective it issued last in its round, and how long it has waited in it."""
        activity = self.activity
        if activity is None or activity.seq <= 0:
            return None
        blocked = self.age(activity.blocked_for, now)
        return CollectiveStatus(seq=activity.seq, kind=activity.kind, blocked_for=blocked)
