"""The liveness watch on a real event loop with a fake job clock: its verdicts and ticks, and
a paused driver excusing the heartbeats it could not hear."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from elastic.driver.control.liveness_watch import LivenessWatch
from elastic.driver.policy.liveness import Limits, Verdict
from elastic.driver.reports import Judged, Report, Tick
from elastic.driver.workers import Worker
from tests.support.policy_views import M, worker

INTERVAL = 0.1  # heartbeat interval: the watch looks this often
LIMITS = Limits(heartbeat_interval=INTERVAL, stop_grace=10.0, start_timeout=600.0)
WAIT = 5.0  # seconds a test waits for a report at most


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def member(worker_id: str, last_heartbeat: float) -> Worker:
    return worker(
        worker_id, M, registered=True, joined=True, heard=True, last_heartbeat=last_heartbeat
    )


def watching(
    workers: list[Worker],
    scenario: Callable[[asyncio.Queue[Report], Clock], Coroutine[Any, Any, None]],
    limits: Limits = LIMITS,
) -> None:
    async def main() -> None:
        reports: asyncio.Queue[Report] = asyncio.Queue()
        clock = Clock()
        task = asyncio.create_task(LivenessWatch(lambda: workers, limits, reports, clock).run())
        try:
            await scenario(reports, clock)
        finally:
            task.cancel()

    asyncio.run(main())


async def look(reports: asyncio.Queue[Report]) -> list[Report]:
    """The reports of the watch's next look, its `Tick` last."""
    async with asyncio.timeout(WAIT):
        found = [await reports.get()]
        while not isinstance(found[-1], Tick):
            found.append(await reports.get())
    return found


def test_a_silent_worker_is_judged_hung_at_every_look_each_followed_by_a_tick() -> None:
    silent = member("r0", last_heartbeat=99.0)  # 1 s silent: more than 3 intervals
    heard = member("r1", last_heartbeat=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Judged(silent, Verdict.HUNG), Tick(100.0)]
        clock.now = 100.1
        heard.last_heartbeat = 100.1
        assert await look(reports) == [Judged(silent, Verdict.HUNG), Tick(100.1)]

    watching([silent, heard], scenario)


@pytest.mark.parametrize(
    ("pause", "said"),
    [(0.4, False), (1.3, True)],
    ids=["a short pause is excused silently", "a pause of 1 s or more is said"],
)
def test_a_paused_driver_excuses_the_heartbeats_it_missed(pause, said, caplog) -> None:
    workers = [member("r0", last_heartbeat=100.0), member("r1", last_heartbeat=100.0)]

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Tick(100.0)]
        clock.now += pause
        time.sleep(pause)  # the driver's loop is blocked: no heartbeat can be heard
        after = await look(reports)
        assert after == [Tick(clock.now)], "no worker is hung for the driver's own pause"
        assert all(w.last_heartbeat == clock.now for w in workers)

    with caplog.at_level(logging.WARNING, logger="elasticrun"):
        watching(workers, scenario)
    paused = [r.getMessage() for r in caplog.records if "was paused for" in r.getMessage()]
    assert len(paused) == (1 if said else 0)
    if said:
        assert paused[0].startswith("this driver was paused for 1.")
        assert "workers' heartbeats are awaited from now" in paused[0]


def test_silence_after_an_excused_pause_is_judged_again() -> None:
    quiet = member("r0", last_heartbeat=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        await look(reports)
        clock.now += 0.4
        time.sleep(0.4)
        assert await look(reports) == [Tick(clock.now)]
        clock.now += 4 * INTERVAL  # the loop runs again, and the worker stays silent
        assert await look(reports) == [Judged(quiet, Verdict.HUNG), Tick(clock.now)]

    watching([quiet], scenario)


def test_a_busy_driver_credits_its_lateness_to_every_worker() -> None:
    quiet = member("r0", last_heartbeat=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        await look(reports)
        clock.now += 0.02
        time.sleep(1.5 * INTERVAL)  # busy: its next look wakes late
        assert await look(reports) == [Tick(clock.now)]
        assert quiet.last_heartbeat > 100.0, "the heartbeats it could not read are not missed"
        assert quiet.last_heartbeat <= clock.now

    watching([quiet], scenario)


def unheard(worker_id: str, registered_at: float) -> Worker:
    """A member that registered with this driver at `registered_at`, no heartbeat read yet."""
    return worker(
        worker_id, M, registered=True, registered_at=registered_at, joined=True,
        last_heartbeat=registered_at,
    )  # fmt: skip


def test_a_worker_whose_heartbeats_never_reached_the_driver_is_not_judged_hung() -> None:
    unheard = worker(
        "r0", M, registered=True, registered_at=99.0, joined=True, last_heartbeat=99.0
    )  # registered 1 s ago: well within the start timeout (600 s)
    silent = member("r1", last_heartbeat=99.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Judged(silent, Verdict.HUNG), Tick(100.0)]
        unheard.heard = True  # its stream's first heartbeat was read; then it went silent
        clock.now += 4 * INTERVAL
        assert await look(reports) == [
            Judged(unheard, Verdict.HUNG),
            Judged(silent, Verdict.HUNG),
            Tick(clock.now),
        ]

    watching([unheard, silent], scenario)


START = 2.0  # the start timeout: how long a registered worker's first heartbeat is awaited
SHORT_START = Limits(heartbeat_interval=INTERVAL, stop_grace=10.0, start_timeout=START)


def test_a_registered_worker_never_heard_is_judged_hung_once_the_start_timeout_passes() -> None:
    """Stopped between its registration (at 100) and its first heartbeat: excused until 102
    (the start timeout), hung 3 intervals later. Unbounded, it was excused forever."""
    stopped = unheard("r0", registered_at=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Tick(100.0)]
        clock.now = 100.0 + START - 0.1  # its first heartbeat may still wait in a backlog
        assert await look(reports) == [Tick(clock.now)]
        clock.now = 100.0 + START + 5 * INTERVAL  # the excuse ended at 102: 5 intervals missed
        assert await look(reports) == [Judged(stopped, Verdict.HUNG), Tick(clock.now)]
        assert stopped.last_heartbeat < 100.0 + START + INTERVAL, "silent since the bound"

    watching([stopped], scenario, SHORT_START)


def test_a_worker_first_heard_late_within_the_start_timeout_is_not_judged_hung() -> None:
    """Both registered at 100: the one whose first heartbeat is read at 101.9 (a backlog)
    beats on and is never hung; the one never heard is, after the bound and 3 intervals."""
    late = unheard("late", registered_at=100.0)
    stopped = unheard("stopped", registered_at=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Tick(100.0)]
        for now in (101.9, 102.3, 102.7, 103.1):  # its beats, read at each look from 101.9
            clock.now = late.last_heartbeat = now
            late.heard = True
            found = await look(reports)
            assert Judged(late, Verdict.HUNG) not in found, f"heard at {now}"
        assert found == [Judged(stopped, Verdict.HUNG), Tick(103.1)]

    watching([late, stopped], scenario, SHORT_START)


def test_a_worker_that_registered_with_an_earlier_driver_gets_no_such_excuse() -> None:
    """No registration with this driver (`registered_at` None; an adopted worker counts as
    heard, with its own grace): nothing moves its last heartbeat forward."""
    adopted = worker("r0", M, registered=True, joined=True, last_heartbeat=100.0)

    async def scenario(reports: asyncio.Queue[Report], clock: Clock) -> None:
        assert await look(reports) == [Tick(100.0)]
        clock.now += 5 * INTERVAL
        assert await look(reports) == [Judged(adopted, Verdict.HUNG), Tick(clock.now)]

    watching([adopted], scenario)
