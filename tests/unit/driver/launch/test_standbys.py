"""The driver's pool of warm standbys (`StandbyPool`), with real processes in place of the
standby command (a Python that sleeps, or one that fails at once): how many it keeps per
host, that only a ready one is taken, what a standby's long poll answers, and that a host
whose standbys keep failing gets no more."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from elastic.driver.launch.launcher import Located, WorkerProcess, WorkerSpec
from elastic.driver.launch.local import LocalLauncher
from elastic.driver.launch.standbys import FAILURES_TO_GIVE_UP, StandbyPool
from tests.support.processes import pids_alive

SLEEPS = [sys.executable, "-c", "import time; time.sleep(60)"]
FAILS = [sys.executable, "-c", "import sys; print('cannot import x', file=sys.stderr); sys.exit(3)"]


def pool(commands: dict[str, list[str]], per_host: int = 1) -> StandbyPool:
    serials = iter(range(1, 1000))

    async def launch(host: str, serial: int, located: Located, env: dict[str, str]) -> Any:
        spec = WorkerSpec(hostname=host, command=commands[host], env=env, cwd=os.getcwd())
        return await LocalLauncher().launch(spec)

    return StandbyPool(
        per_host, ["python", "t.py"], (), launch=launch,
        environment=lambda worker_id, host: {"PATH": os.environ["PATH"]},
        next_serial=lambda: next(serials), stop_grace=1.0,
    )  # fmt: skip


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


async def started(standbys: StandbyPool, host: str, count: int) -> list[WorkerProcess]:
    for _ in range(200):
        processes = [s.process for s in standbys.on(host) if s.process is not None]
        if len(processes) == count:
            return processes
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} standby(s) not started on {host}")


def test_each_wanted_host_keeps_its_count_and_only_a_ready_one_is_taken() -> None:
    async def test() -> None:
        standbys = pool({"a": SLEEPS, "b": SLEEPS}, per_host=2)
        standbys.keep({"a", "b"}, {"a", "b"})
        standbys.keep({"a", "b"}, {"a", "b"})  # a second look starts no more
        await started(standbys, "a", 2)
        await started(standbys, "b", 2)
        assert standbys.take("a") is None, "none has waited at the driver yet: none is ready"
        first = standbys.on("a")[0]
        polled = asyncio.ensure_future(standbys.wait(first.standby_id, 30.0))
        await asyncio.sleep(0.05)
        assert standbys.take("a") is first
        process = StandbyPool.hand_over(first, {"ELASTIC_WORKER_ID": "a[0]#7"}, lambda p, f: None)
        answer = await polled
        assert (answer.status, answer.env) == ("run", {"ELASTIC_WORKER_ID": "a[0]#7"})
        again = await standbys.wait(first.standby_id, 0.0)  # its answer was lost: asked again
        assert again.status == "run"
        assert len(standbys.on("a")) == 1 and standbys.taken == 1
        standbys.keep({"a", "b"}, {"a", "b"})
        await started(standbys, "a", 2)  # the taken one is replaced
        assert (await standbys.wait("nobody#standby.99", 0.0)).status == "exit"
        process.kill()
        await standbys.close()

    run(test)


def test_a_host_no_longer_allowed_loses_its_standbys_and_they_are_told_to_exit() -> None:
    async def test() -> None:
        standbys = pool({"a": SLEEPS})
        standbys.keep({"a"}, {"a"})
        (process,) = await started(standbys, "a", 1)
        standby = standbys.on("a")[0]
        standbys.keep(set(), set())  # gone from discovery, drained or noticed
        assert (await standbys.wait(standby.standby_id, 5.0)).status == "exit"
        assert await asyncio.wait_for(process.wait(), 5) != 0
        assert pids_alive([process.pid]) == []
        await standbys.close()

    run(test)


def test_standbys_that_keep_failing_before_they_are_ready_are_given_up_on_that_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def test() -> None:
        standbys = pool({"a": FAILS, "b": SLEEPS})
        for _ in range(200):
            standbys.keep({"a", "b"}, {"a", "b"})
            await asyncio.sleep(0.05)
            if any("no more standbys" in r.message for r in caplog.records):
                break
        assert standbys.on("a") == [] and len(standbys.on("b")) == 1
        await standbys.close()

    with caplog.at_level(logging.WARNING, logger="elasticrun"):
        run(test)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1] == (
        f"no more standbys on host a: {FAILURES_TO_GIVE_UP} in a row failed; the last ended "
        "with exit code 3 before it was ready: cannot import x"
    ), lines


def test_closing_stops_every_standby_not_taken() -> None:
    async def test() -> None:
        standbys = pool({"a": SLEEPS, "b": SLEEPS})
        standbys.keep({"a", "b"}, {"a", "b"})
        processes = [*await started(standbys, "a", 1), *await started(standbys, "b", 1)]
        await standbys.close()
        assert pids_alive([p.pid for p in processes]) == []

    run(test)
