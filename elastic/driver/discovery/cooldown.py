"""Host cooldown (horovodrun's blacklist): a failed host is excluded for a growing time.

Pure logic: every call that depends on time takes `now` (seconds on any monotonic clock), and
the jitter comes from an injected `random.Random`, so the delays are deterministic in tests.

The delay after a host's n-th counted failure (n = 1, 2, ...) is

    base(n)  = min(high, seed * 2 ** (n - 1))         seed = low if low > 0 else 1 second
    lo, hi   = max(low, base(n) * (1 - JITTER)), min(high, base(n) * (1 + JITTER))
    delay(n) = lo + u * (hi - lo)                      u = rng.random(), JITTER = 0.2

so it doubles per failure from `low` up to `high` and is drawn uniformly from +-20 % around
that, cut to the range [low, high]: the first failure gives [low, 1.2 low], a capped one
[0.8 high, high]. Hosts that failed together therefore do not all come back together.
With `low == 0` the doubling starts from one second (a range `0 300` still grows: ~1, 2, 4,
... 300 s); `0 0` disables cooldown. `low = high = inf` excludes a failed host for good
(horovodrun's behaviour without a cooldown range).

A failure is counted only when the host is not already in cooldown (see `record_failure`), so
n counts separate incidents, not the workers of one host that died together.
"""

from __future__ import annotations

import math
import random
from collections.abc import Container
from dataclasses import dataclass

from elastic.driver.errors import SettingsError

JITTER = 0.2
"""Relative jitter: a delay lies within this fraction of its base, either way."""

_SEED_WHEN_LOW_IS_ZERO = 1.0


def validate_cooldown_range(low: float, high: float) -> tuple[float, float]:
    """Check the `--blacklist-cooldown-range MIN MAX` values; return them as `(low, high)`.

    Raises `SettingsError` (one line, naming the flag) when a value is not a finite number,
    when MIN < 0, or when MAX < MIN.
    """
    flag = "--blacklist-cooldown-range"
    for value in (low, high):
        if not math.isfinite(value):
            raise SettingsError(f"{flag}: {value} is not a number of seconds")
    if low < 0:
        raise SettingsError(f"{flag}: MIN must be 0 or more, got {low:g}")
    if high < low:
        raise SettingsError(f"{flag}: MAX ({high:g}) must not be less than MIN ({low:g})")
    return float(low), float(high)


@dataclass
class _Record:
    failures: int
    until: float


class Cooldown:
    """Per-host failure counts and the time each host's current exclusion ends.

    A failure recorded while the host is still in cooldown is not counted again: the workers
    of one host that dies all fail at about the same moment and must count as one failure.
    """

    def __init__(self, low: float, high: float, rng: random.Random) -> None:
        if not (0 <= low <= high):
            raise ValueError(f"cooldown range must satisfy 0 <= low <= high, got {low}, {high}")
        self.low = low
        self.high = high
        self._rng = rng
        self._records: dict[str, _Record] = {}

    def delay(self, failures: int) -> float:
        """The exclusion after a host's `failures`-th counted failure (draws one jitter value)."""
        if failures < 1:
            raise ValueError(f"failures must be at least 1, got {failures}")
        seed = self.low if self.low > 0 else _SEED_WHEN_LOW_IS_ZERO
        # 2.0 ** large overflows to an OverflowError only past ~1024; cap the exponent.
        base = min(self.high, seed * 2.0 ** min(failures - 1, 1000))
        lo = max(self.low, base * (1 - JITTER))
        hi = min(self.high, base * (1 + JITTER))
        u = self._rng.random()
        return lo if hi <= lo else lo + u * (hi - lo)  # hi <= lo: no room, or both infinite

    def record_failure(self, host: str, now: float) -> float:
        """Count a failure of `host` at `now` and return the time its exclusion ends.

        If `host` is in cooldown at `now`, nothing changes and its current end is returned.
        """
        record = self._records.get(host)
        if record is not None and now < record.until:
            return record.until
        failures = (record.failures if record else 0) + 1
        until = now + self.delay(failures)
        self._records[host] = _Record(failures, until)
        return until

    def record_success(self, host: str) -> None:
        """One step of decay: forget one counted failure of `host` (the next delay halves).

        Call it when the host's workers have run well for a while (say, for `high` seconds
        after rejoining), not at every step. An exclusion in progress is not shortened, and
        the count never goes below 0 (the next failure then counts as the first).
        """
        record = self._records.get(host)
        if record is not None and record.failures > 0:
            record.failures -= 1

    def in_cooldown(self, host: str, now: float) -> bool:
        """Whether `host` is excluded at `now`."""
        record = self._records.get(host)
        return record is not None and now < record.until

    def until(self, host: str) -> float | None:
        """When the host's latest exclusion ends (in the past once it has ended); None if no
        failure of the host was ever recorded."""
        record = self._records.get(host)
        return record.until if record else None

    def failures(self, host: str) -> int:
        """The host's counted failures (after decay by `record_success`)."""
        record = self._records.get(host)
        return record.failures if record else 0

    def records(self) -> dict[str, tuple[int, float]]:
        """Every host's (counted failures, end of its latest exclusion), to save."""
        return {host: (r.failures, r.until) for host, r in self._records.items()}

    def forget_gone(self, offered: Container[str], now: float) -> None:
        """Forget the hosts not `offered` (by discovery) whose exclusion has ended by `now`:
        a spot fleet's hosts come and go under new names, and each would be kept for good.
        One that is offered again later counts its next failure as its first."""
        for host in [h for h, r in self._records.items() if h not in offered and r.until <= now]:
            del self._records[host]

    def restore(self, host: str, failures: int, until: float) -> None:
        """Put back a record saved by `records` (a restarted driver resuming a job)."""
        self._records[host] = _Record(failures, until)
