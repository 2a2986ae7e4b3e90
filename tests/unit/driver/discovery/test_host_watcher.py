"""The host watcher with a scripted discovery, real host access for local names and a fake
job clock: the first hosts, and the changes of the usable hosts it reports."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from elastic.driver.discovery import DiscoveryError, HostDiscovery, HostTracker
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.errors import LaunchError
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.reports import HostsChanged, Report

COOLDOWN = 10.0  # seconds a failed host is excluded (no jitter: the range is one value)
WAIT = 5.0  # seconds a test waits for a report at most

A, B = HostSpec("localhost", 1), HostSpec("127.0.0.1", 2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedDiscovery(HostDiscovery):
    """Gives its answers in turn, then the last one again; an exception answer is raised.
    Each call takes one second on the job's clock."""

    def __init__(self, clock: Clock, *answers: list[HostSpec] | DiscoveryError) -> None:
        self._clock = clock
        self.answers = list(answers)
        self.calls = 0

    async def find(self) -> list[HostSpec]:
        self.calls += 1
        self._clock.now += 1.0
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, DiscoveryError):
            raise answer
        return answer


Scenario = Callable[[HostWatcher, ScriptedDiscovery, asyncio.Queue[Report], Clock], Coroutine]


def watch(*answers: list[HostSpec] | DiscoveryError) -> Callable[[Scenario], None]:
    def run(scenario: Scenario) -> None:
        async def main() -> None:
            clock = Clock()
            discovery = ScriptedDiscovery(clock, *answers)
            reports: asyncio.Queue[Report] = asyncio.Queue()
            tracker = HostTracker(Cooldown(COOLDOWN, COOLDOWN, random.Random(0)))
            access = HostAccess(SshOptions(), stop_grace=1.0, ssh_timeout=1.0)
            watcher = HostWatcher(discovery, tracker, access, reports, 0.001, clock)
            await scenario(watcher, discovery, reports, clock)

        asyncio.run(main())

    return run


async def next_change(reports: asyncio.Queue[Report]) -> Any:
    report = await asyncio.wait_for(reports.get(), WAIT)
    assert isinstance(report, HostsChanged)
    return report.change


def test_first_hosts_returns_once_discovery_offers_enough_slots() -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        assert await watcher.first_hosts(3, 3, timeout=60.0) == [A, B]
        assert discovery.calls == 3
        assert reports.empty()  # the first hosts are the answer, not a change

    watch([], [A], [A, B])(scenario)


def test_first_hosts_waits_for_np_slots_though_min_np_are_offered_sooner() -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        assert await watcher.first_hosts(3, 1, timeout=60.0) == [A, B]
        assert discovery.calls == 3

    watch([A], [A], [A, B])(scenario)


def test_first_hosts_starts_with_min_np_slots_past_the_timeout_saying_so(caplog) -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        with caplog.at_level(logging.WARNING, logger="elasticrun"):
            assert await watcher.first_hosts(3, 1, timeout=5.0) == [A]
        assert clock.now == 5.0  # it waited for -np until then

    watch([A])(scenario)
    assert caplog.messages == [
        "starting with 1 slot(s): discovery offered fewer than -np 3 within 5 s "
        "(--start-timeout); the job grows as more are offered"
    ]


def test_first_hosts_fails_after_the_timeout_naming_the_discovery_error() -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        with pytest.raises(LaunchError) as raised:
            await watcher.first_hosts(2, 2, timeout=5.0)
        assert str(raised.value) == (
            "discovery found 1 slot(s), fewer than --min-np 2, within 5 s (--start-timeout) "
            "(discovery: hosts.sh exited with code 3: no cluster)"
        )
        assert clock.now == 5.0  # it kept asking until then

    watch([A], DiscoveryError("hosts.sh exited with code 3: no cluster"))(scenario)


def test_run_reports_each_change_of_the_discovered_hosts(caplog) -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        await watcher.first_hosts(1, 1, timeout=60.0)
        task = asyncio.create_task(watcher.run())
        try:
            change = await next_change(reports)
            assert (change.hosts, change.added, change.removed) == ((A, B), ("127.0.0.1",), ())
            change = await next_change(reports)
            assert (change.hosts, change.added, change.removed) == ((B,), (), ("localhost",))
            while discovery.calls < 8:
                await asyncio.sleep(0.01)
            assert reports.empty(), "a failed discovery keeps the last good hosts"
        finally:
            task.cancel()

    fails = DiscoveryError("hosts.sh timed out")
    with caplog.at_level(logging.ERROR, logger="elasticrun"):
        watch([A], [A], [A, B], [A, B], [B], fails, fails)(scenario)
    failures = [r.getMessage() for r in caplog.records if "discovery failed" in r.getMessage()]
    assert failures == ["host discovery failed, keeping the last good hosts: hosts.sh timed out"]


def test_a_failed_host_is_reported_at_once_and_again_when_its_cooldown_ends(caplog) -> None:
    async def scenario(watcher, discovery, reports, clock) -> None:
        await watcher.first_hosts(3, 3, timeout=60.0)
        with caplog.at_level(logging.WARNING, logger="elasticrun"):
            watcher.host_failed("127.0.0.1", "worker r1 died")
        change = reports.get_nowait().change
        assert (change.hosts, change.removed) == ((A,), ("127.0.0.1",))
        assert watcher.usable() == [A]
        assert "host 127.0.0.1 in cooldown for 10 s (worker r1 died)" in caplog.messages
        watcher.host_failed("127.0.0.1", "worker r2 died")  # the same incident
        assert reports.empty()

        task = asyncio.create_task(watcher.run())
        try:
            change = await next_change(reports)  # each poll takes 1 s: 10 polls
            assert (change.hosts, change.added) == ((A, B), ("127.0.0.1",))
            assert clock.now >= 1.0 + COOLDOWN
        finally:
            task.cancel()

    watch([A, B])(scenario)
