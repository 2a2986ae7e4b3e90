"""The one retry policy of every worker-to-driver call: bounded in time, exponential backoff
with jitter (thousands of workers that lost the driver together must not retry in lockstep)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import tenacity

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.05  # seconds before the first retry, at most
BACKOFF_MAX = 2.0  # seconds between two attempts, at most


def jittered(delay: float, rng: random.Random | None = None) -> float:
    """`delay` spread uniformly over [delay / 2, delay] ("equal jitter": half of it kept, so
    retries stay spaced, half drawn at random, so simultaneous failures spread out)."""
    draw = (rng or random).random()
    return delay / 2 + delay / 2 * draw


class Backoff:
    """The waits between attempts to reopen a stream: `first` s doubling up to `cap`, each
    jittered (`jittered`); `reset()` when an attempt succeeded."""

    def __init__(
        self,
        first: float = BACKOFF_FIRST,
        cap: float = BACKOFF_MAX,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first <= cap, not first={first}, cap={cap}")
        self._first, self._cap, self._rng = first, cap, rng
        self._delay = first

    def next(self) -> float:
        """Seconds to wait before the next attempt (the schedule then grows)."""
        wait = jittered(self._delay, self._rng)
        self._delay = min(self._delay * 2, self._cap)
        return wait

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits `first` s again (at most)."""
        self._delay = self._first


def bounded_retries(
    retry_for: float,
    retryable: Callable[[BaseException], bool],
    moved: Callable[[], bool] | None = None,
    rng: random.Random | None = None,
) -> tenacity.Retrying:
    """Retry while `retryable(error)` holds, for at most `retry_for` seconds in all (backoff
    from 50 ms doubling to 2 s, each wait jittered over its upper half); the last error is
    re-raised. `moved()` runs before each wait: when it says the driver now serves
    elsewhere, the next attempt goes at once."""
    backoff = tenacity.wait_exponential(multiplier=BACKOFF_FIRST, max=BACKOFF_MAX)

    def wait(state: tenacity.RetryCallState) -> float:
        if moved is not None and moved():
            return 0.0
        return jittered(backoff(state), rng)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        stop=tenacity.stop_after_delay(retry_for),
        wait=wait,
        reraise=True,
    )


class Outage:
    """Logs the start of a period in which the driver cannot be reached, once, and its end."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._since: float | None = None

    def failed(self, why: str) -> None:
        """An attempt failed (`why`: the error in words); logged if the outage is new."""
        if self._since is None:
            self._since = time.monotonic()
            log.warning("%s: driver unreachable (%s); retrying until it is back", self._what, why)

    def succeeded(self) -> None:
        """An attempt succeeded; logged if it ends an outage."""
        if self._since is not None:
            down_for = time.monotonic() - self._since
            log.warning("%s: driver reachable again after %.1f s", self._what, down_for)
            self._since = None
