"""Which discovered hosts are usable now, and what changed. Pure logic, no I/O, no sleeps.

The driver feeds it every discovery result (`discovered`) or failure (`discovery_failed`), every
host failure it notices (`host_failed`), and calls `refresh` when a cooldown may have ended
(`next_expiry` says when). Each call returns a `TrackerUpdate`: the change to act on, if the
usable hosts changed, and the discovery error to log, if there is a new one.

Rules:
* A failed discovery keeps the last good host list. Its error is returned for logging only
  when its message differs from the previous failure's, so a script that keeps failing the
  same way logs one line, not one per poll; the first success after failures says so once.
* A host is usable when the last good list has it, it is not in cooldown, it carries no
  preemption notice whose time is still ahead (`HostSpec.leaving_at`; `leaving` says which)
  and it is not drained (`drain`, until undrained).
* Order: usable hosts are ordered by when they last became usable, earliest first; hosts that
  became usable at the same call keep the order the source gave. A host keeps its place while
  it stays usable, whatever order later results give, so ranks of long-lived hosts stay low.
  A host that leaves (removed by discovery or cooled down) and comes back goes to the end.
* Every change of the usable hosts (a host added or removed, or a host's slot count changed)
  bumps `version` by one; nothing else does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec


@dataclass(frozen=True)
class HostChange:
    """The usable hosts after a change, and how they differ from the ones before."""

    version: int
    hosts: tuple[HostSpec, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    resized: tuple[str, ...]
    """Hosts usable before and after whose slot count changed."""


@dataclass(frozen=True)
class TrackerUpdate:
    change: HostChange | None = None
    """Set when the usable hosts changed."""
    error: str | None = None
    """A discovery error to log: set only when it differs from the previous one."""
    recovered: bool = False
    """True on the first good discovery result after failures."""


class HostTracker:
    def __init__(self, cooldown: Cooldown) -> None:
        self.cooldown = cooldown
        self._discovered: tuple[HostSpec, ...] = ()
        self._has_result = False
        self._error: str | None = None
        self._usable: tuple[HostSpec, ...] = ()
        self._since: dict[str, int] = {}  # usable host -> when it became usable (a counter)
        self._counter = 0
        self._version = 0
        self._notices: dict[str, float] = {}  # host -> when it goes, from workers' checks
        self.drained: set[str] = set()  # hosts an operator took out, until undrained

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        """The usable hosts, in order, as of the last call."""
        return self._usable

    @property
    def version(self) -> int:
        """0 before any host was usable; +1 at every change of the usable hosts."""
        return self._version

    @property
    def discovered_hosts(self) -> tuple[HostSpec, ...]:
        """The last good discovery result, hosts in cooldown included, in source order."""
        return self._discovered

    @property
    def has_result(self) -> bool:
        """Whether discovery has succeeded at least once."""
        return self._has_result

    @property
    def error(self) -> str | None:
        """The latest discovery error, until the next good result."""
        return self._error

    @property
    def slots(self) -> int:
        """The number of usable slots."""
        return sum(spec.slots for spec in self._usable)

    def discovered(self, hosts: Iterable[HostSpec], now: float) -> TrackerUpdate:
        """Record a good discovery result (a host named twice counts once, its first entry)."""
        unique: dict[str, HostSpec] = {}
        for spec in hosts:
            unique.setdefault(spec.hostname, spec)
        self._discovered = tuple(unique.values())
        # What is kept per host is bounded by the hosts offered, not by all ever offered.
        self.cooldown.forget_gone(unique, now)
        self._notices = {name: at for name, at in self._notices.items() if name in unique}
        self._has_result = True
        recovered = self._error is not None
        self._error = None
        return TrackerUpdate(change=self._recompute(now), recovered=recovered)

    def discovery_failed(self, message: str, now: float) -> TrackerUpdate:
        """Record a failed discovery; the last good result stays in use."""
        new = message != self._error
        self._error = message
        return TrackerUpdate(change=self._recompute(now), error=message if new else None)

    def host_failed(self, hostname: str, now: float) -> TrackerUpdate:
        """Put `hostname` in cooldown (see `Cooldown.record_failure`; failures of a host
        already in cooldown do not count again) and drop it from the usable hosts."""
        self.cooldown.record_failure(hostname, now)
        return TrackerUpdate(change=self._recompute(now))

    def refresh(self, now: float) -> TrackerUpdate:
        """Bring back hosts whose cooldown has ended by `now`."""
        return TrackerUpdate(change=self._recompute(now))

    def leaving(self, now: float) -> dict[str, float]:
        """Discovered hosts under a preemption notice (discovery's, or a worker's check's:
        `noticed`) whose time is still ahead of `now`, with that time (`math.inf`: none
        given; the later one where both gave one)."""
        found = {
            spec.hostname: max(spec.leaving_at or 0.0, self._notices.get(spec.hostname, 0.0))
            for spec in self._discovered
        }
        return {name: at for name, at in found.items() if at > now}

    def noticed(self, hostname: str, at: float, now: float) -> TrackerUpdate:
        """A worker's preemption check says `hostname` goes at `at` (this tracker's clock)."""
        self._notices[hostname] = max(at, self._notices.get(hostname, 0.0))
        return TrackerUpdate(change=self._recompute(now))

    def drain(self, hostname: str, drained: bool, now: float) -> TrackerUpdate:
        """Take `hostname` out of the usable hosts (`drained`) until it is undrained."""
        if drained:
            self.drained.add(hostname)
        else:
            self.drained.discard(hostname)
        return TrackerUpdate(change=self._recompute(now))

    def states(self, now: float) -> list[tuple[HostSpec, str, float | None]]:
        """Every discovered host with its state (drained, cooldown, leaving or active) and,
        for cooldown and leaving, until when (this tracker's clock; None: no time known)."""
        leaving = self.leaving(now)
        found: list[tuple[HostSpec, str, float | None]] = []
        for spec in self._discovered:
            name = spec.hostname
            if name in self.drained:
                found.append((spec, "drained", None))
            elif self.cooldown.in_cooldown(name, now):
                found.append((spec, "cooldown", self.cooldown.until(name)))
            elif name in leaving:
                at = leaving[name]
                found.append((spec, "leaving", at if math.isfinite(at) else None))
            else:
                found.append((spec, "active", None))
        return found

    def next_expiry(self, now: float) -> float | None:
        """The earliest time after `now` at which a discovered host leaves cooldown, or its
        notice's time passes (call `refresh` then); None if there is no such time."""
        ends = [
            end
            for spec in self._discovered
            if (end := self.cooldown.until(spec.hostname)) is not None and end > now
        ]
        ends += [at for at in self.leaving(now).values() if math.isfinite(at)]
        return min(ends, default=None)

    def _recompute(self, now: float) -> HostChange | None:
        leaving = self.leaving(now)
        candidates = [
            spec
            for spec in self._discovered
            if not self.cooldown.in_cooldown(spec.hostname, now)
            and spec.hostname not in leaving
            and spec.hostname not in self.drained
        ]
        names = {spec.hostname for spec in candidates}
        self._since = {name: when for name, when in self._since.items() if name in names}
        for spec in candidates:
            if spec.hostname not in self._since:
                self._counter += 1
                self._since[spec.hostname] = self._counter
        usable = tuple(sorted(candidates, key=lambda spec: self._since[spec.hostname]))
        if usable == self._usable:
            return None
        before = {spec.hostname: spec.slots for spec in self._usable}
        after = {spec.hostname: spec.slots for spec in usable}
        self._usable = usable
        self._version += 1
        return HostChange(
            version=self._version,
            hosts=usable,
            added=tuple(name for name in after if name not in before),
            removed=tuple(name for name in before if name not in after),
            resized=tuple(name for name in after if name in before and before[name] != after[name]),
        )
