"""Runs discovery, feeds the tracker, and reports changes of the usable hosts to the job."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace

from elastic.driver.discovery.host_discovery import DiscoveryError, HostDiscovery
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.tracker import HostTracker, TrackerUpdate
from elastic.driver.errors import LaunchError
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.policy.planning import Start, start_check
from elastic.driver.reports import HostsChanged, Reports

log = logging.getLogger("elasticrun")

PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines


class HostWatcher:
    """The usable hosts: discovered, reachable by the launcher, not in cooldown.

    `first_hosts` waits for enough slots to start; `run` then polls discovery every
    `interval` and ends cooldowns when due, reporting each change as `HostsChanged`;
    `host_failed` puts a host in cooldown (the change is reported too).
    """

    def __init__(
        self,
        discovery: HostDiscovery,
        tracker: HostTracker,
        access: HostAccess,
        reports: Reports,
        interval: float,
        clock: Callable[[], float],
    ) -> None:
        self.tracker = tracker
        self._discovery = discovery
        self._access = access
        self._reports = reports
        self._interval = interval
        self._clock = clock

    def usable(self) -> list[HostSpec]:
        return [h for h in self.tracker.hosts if self._access.usable(h.hostname)]

    async def first_hosts(self, wanted: int, needed: int, timeout: float) -> list[HostSpec]:
        """The usable hosts once they offer `wanted` slots (-np), or, past `timeout` s
        (--start-timeout), `needed` (--min-np) at least, saying so (`start_check`);
        `LaunchError` when they offer fewer than `needed` by then. Prints a progress line
        every `PROGRESS_EVERY` s."""
        start = last_line = self._clock()
        while True:
            await self._discover()  # what it finds is the answer, not a change to report
            usable = self.usable()
            slots = sum(h.slots for h in usable)
            now = self._clock()
            verdict = start_check(slots, wanted, needed, now - start, timeout)
            if verdict is Start.NOW:
                if slots < wanted:
                    log.warning(
                        "starting with %d slot(s): discovery offered fewer than -np %d within "
                        "%g s (--start-timeout); the job grows as more are offered",
                        slots, wanted, timeout,
                    )  # fmt: skip
                return usable
            if verdict is Start.FAIL:
                problem = f" (discovery: {self.tracker.error})" if self.tracker.error else ""
                raise LaunchError(
                    f"discovery found {slots} slot(s), fewer than --min-np {needed}, "
                    f"within {timeout:g} s (--start-timeout){problem}"
                )
            if now - last_line >= PROGRESS_EVERY:
                last_line = now
                log.warning("waiting for %d slot(s) from discovery, %d so far", wanted, slots)
            await asyncio.sleep(self._interval)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self._report(await self._discover())
            expiry = self.tracker.next_expiry(self._clock() - 1e-9)
            if expiry is not None and expiry <= self._clock():
                self._report(self.tracker.refresh(self._clock()))

    async def _discover(self) -> TrackerUpdate:
        try:
            hosts = await self._discovery.find()
        except DiscoveryError as err:
            update = self.tracker.discovery_failed(str(err), self._clock())
            if update.error:
                log.error("host discovery failed, keeping the last good hosts: %s", update.error)
        else:
            await self._access.learn(h.hostname for h in hosts)  # DNS, off the event loop
            now = self._clock()
            # Notices carry Unix times; the tracker runs on the driver's clock.
            offset = now - time.time()
            hosts = [
                replace(h, leaving_at=h.leaving_at + offset) if h.leaving_at is not None else h
                for h in hosts
            ]
            self._say_notices(hosts, now)
            update = self.tracker.discovered(hosts, now)
            if update.recovered:
                log.warning("host discovery works again")
        return update

    def _say_notices(self, hosts: list[HostSpec], now: float) -> None:
        """One line per host the first time discovery gives it a notice."""
        before = self.tracker.leaving(now)
        for host in hosts:
            if host.leaving_at is not None and host.hostname not in before:
                _say_notice(host.hostname, host.leaving_at, now, "discovery's notice")

    def host_noticed(self, hostname: str, leaving_at: float) -> None:
        """A worker's preemption check says `hostname` goes at `leaving_at` (Unix seconds)."""
        now = self._clock()
        at = leaving_at + now - time.time()  # on the driver's clock
        if hostname not in self.tracker.leaving(now):
            _say_notice(hostname, at, now, "its preemption check")
        self._report(self.tracker.noticed(hostname, at, now))

    def drain(self, hostname: str, drained: bool) -> None:
        """An operator drained (or undrained) `hostname`."""
        self._report(self.tracker.drain(hostname, drained, self._clock()))

    def host_failed(self, hostname: str, reason: str) -> None:
        update = self.tracker.host_failed(hostname, self._clock())
        until = self.tracker.cooldown.until(hostname)
        if until is not None and until > self._clock():
            log.warning(
                "host %s in cooldown for %.0f s (%s)", hostname, until - self._clock(), reason
            )
        self._report(update)

    def _report(self, update: TrackerUpdate) -> None:
        if update.change is not None:
            self._reports.put_nowait(HostsChanged(update.change))


def _say_notice(hostname: str, at: float, now: float, source: str) -> None:
    if at <= now:
        return
    when = f"in {at - now:.0f} s" if math.isfinite(at) else "soon"
    log.warning(
        "host %s leaves %s (%s): its workers leave at their next step, and it gets no new "
        "ones until then",
        hostname,
        when,
        source,
        extra={"event": "leave", "host": hostname},
    )
