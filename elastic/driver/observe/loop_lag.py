"""How late the driver's event loop runs: a timer's delay past its due time.

Every part of the driver (the rendezvous, heartbeats, the HTTP API) runs on one event loop;
a blocking call anywhere shows here first, as lag, before it shows as a slow recovery. The
liveness watch's periodic look (every 0.25 s at most) is the timer measured.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW = 10.0  # seconds `worst` looks back


class LoopLag:
    """The lags `record` was told; `worst` is the largest of the last `window` seconds (0.0
    before any). `clock` is monotonic time."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self._window, self._clock = window, clock
        self._lags: deque[tuple[float, float]] = deque()  # (when, lag), lags decreasing

    def record(self, lag: float) -> None:
        """A timer ran `lag` seconds late now."""
        now = self._clock()
        lags = self._lags
        while lags and lags[-1][1] <= lag:  # never the worst again: a larger one is newer
            lags.pop()
        lags.append((now, lag))
        while lags[0][0] < now - self._window:
            lags.popleft()

    @property
    def worst(self) -> float:
        now = self._clock()
        while self._lags and self._lags[0][0] < now - self._window:
            self._lags.popleft()
        return self._lags[0][1] if self._lags else 0.0
