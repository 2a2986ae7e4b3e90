"""Warm standbys: processes started ahead of need on the job's hosts, which have imported
torch, the worker runtime and the user's `--preload` modules and wait at the driver
(`elastic.worker.standby`). A slot refilled on a host with a ready standby takes it: the
standby gets the new worker's environment and runs the job's command in its own process.

A standby is never a member and never counts as a worker until it is taken; then it is that
worker (its process, output and exit are the worker's). Each host keeps `per_host` of them
while the job wants them there (`StandbyPool.keep`); a used one is replaced at the next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.launch.launcher import Located, WorkerProcess
from elastic.protocol.env import STANDBY_COMMAND, STANDBY_ID, STANDBY_PRELOAD
from elastic.protocol.http import StandbyAnswer, StandbyStatus

log = logging.getLogger("elasticrun")

FAILURES_TO_GIVE_UP = 3  # standbys in a row that end before they are ready: none on that host
TAIL_BYTES = 2000  # of a failed standby's error output, for the line that says why

Launch = Callable[[str, int, Located, dict[str, str]], Awaitable[WorkerProcess]]
"""Start a process for `(hostname, serial, located, env)` running the standby command."""
Environment = Callable[[str, str], dict[str, str]]
"""The job's worker variables for `(worker id, hostname)`, no slot."""


@dataclass(eq=False)
class Standby:
    """One standby process, from its launch until it is taken or ends."""

    standby_id: str
    hostname: str
    serial: int  # its number in the job's worker numbering (its folder's name)
    process: WorkerProcess | None = None  # None while it starts
    launcher_pid: int | None = None
    log_dir: str | None = None
    ready: bool = False  # it waited at the driver: its imports are done
    exit_code: int | None = None
    taken: bool = False
    given: asyncio.Future[dict[str, str] | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )  # a worker's environment once taken; None once it is not wanted
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    on_located: Located | None = None  # the taking worker's, for a remote detached one


class TakenStandby(WorkerProcess):
    """A standby's process, seen as the worker that took it: the same process, its end
    watched once by the pool (`Standby.ended`)."""

    def __init__(self, standby: Standby) -> None:
        process = standby.process
        assert process is not None
        self._standby, self._process = standby, process
        for stream in ("stdout", "stderr"):  # a detached local one has files instead
            if (reader := getattr(process, stream, None)) is not None:
                setattr(self, stream, reader)
        self.log_dir, self.detached = process.log_dir, process.detached

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def signal(self) -> int | None:
        return self._process.signal

    async def wait(self) -> int:
        await self._standby.ended.wait()
        assert self._standby.exit_code is not None
        return self._standby.exit_code

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()


class StandbyPool:
    """The job's standbys, by host.

    `keep` starts and stops them, `take` gives a ready one to a worker, `wait` answers a
    standby's long poll, `close` stops them all (the job's end). A standby that ends before
    it is ready, `FAILURES_TO_GIVE_UP` times in a row on one host, turns them off on that host
    with one line saying why (a `--preload` module that does not import, most often).
    """

    def __init__(
        self,
        per_host: int,
        command: list[str],
        preload: tuple[str, ...],
        *,
        launch: Launch,
        environment: Environment,
        next_serial: Callable[[], int],
        stop_grace: float,
    ) -> None:
        self.per_host = per_host
        self._command_json = json.dumps(command)
        self._preload = ",".join(preload)
        self._launch = launch
        self._environment = environment
        self._next_serial = next_serial
        self._stop_grace = stop_grace
        self._standbys: dict[str, Standby] = {}  # by id: started and neither taken nor ended
        self._taken: dict[str, Standby] = {}  # by id: taken and not ended
        self._failures: dict[str, int] = {}  # host -> standbys in a row that failed early
        self._given_up: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers: set[asyncio.Task[None]] = set()  # the watches of taken standbys
        self._runs: dict[str, asyncio.Task[None]] = {}  # each standby's watch, by id
        self.taken = 0  # standbys that became workers
        self.started = 0

    def describe(self) -> list[StandbyStatus]:
        """The standbys waiting or starting now, for `/v1/status`."""
        return [
            StandbyStatus(standby_id=s.standby_id, hostname=s.hostname,
                          pid=s.launcher_pid, ready=s.ready)
            for s in self._standbys.values()
        ]  # fmt: skip

    def on(self, hostname: str) -> list[Standby]:
        """The standbys on `hostname` now (starting or ready)."""
        return [s for s in self._standbys.values() if s.hostname == hostname]

    def keep(self, wanted: set[str], allowed: set[str]) -> None:
        """Start standbys so each host of `wanted` has `per_host`; stop those on hosts not in
        `allowed` (gone from discovery, drained, under a preemption notice). Never waits."""
        for standby in list(self._standbys.values()):
            if standby.hostname not in allowed:
                self._stop(standby, "its host is no longer usable")
        for hostname in sorted(wanted - self._given_up):
            for _ in range(self.per_host - len(self.on(hostname))):
                self._start(hostname)

    def take(self, hostname: str) -> Standby | None:
        """A ready standby on `hostname`, now the caller's (see `hand_over`), or None."""
        for standby in self.on(hostname):
            if standby.ready and standby.process is not None and standby.exit_code is None:
                standby.taken = True
                self._taken[standby.standby_id] = self._standbys.pop(standby.standby_id)
                if (watch := self._runs.get(standby.standby_id)) is not None:
                    self._workers.add(watch)
                self.taken += 1
                return standby
        return None

    @staticmethod
    def hand_over(standby: Standby, env: dict[str, str], located: Located) -> WorkerProcess:
        """Give taken `standby` a worker's whole environment `env`: it runs the job's command
        as that worker. Returns its process, as the worker's; `located` is told where it runs
        on its host if that is not known yet (a remote detached one)."""
        standby.on_located = located
        if standby.launcher_pid is not None and standby.log_dir is not None:
            located(standby.launcher_pid, standby.log_dir)
        if not standby.given.done():
            standby.given.set_result(env)
        return TakenStandby(standby)

    async def wait(self, standby_id: str, timeout: float) -> StandbyAnswer:
        """A standby's long poll: its worker's environment once it is taken (`run`); `exit`
        when this driver does not want it (it is unknown here, stopped, or the job ends);
        `pending` after `timeout` seconds."""
        # A taken one asks again only when its answer was lost on the way.
        standby = self._standbys.get(standby_id) or self._taken.get(standby_id)
        if standby is None:
            return StandbyAnswer(status="exit")
        if not standby.ready:
            standby.ready = True
            self._failures.pop(standby.hostname, None)  # "in a row": this one is ready
        try:
            env = await asyncio.wait_for(asyncio.shield(standby.given), timeout)
        except TimeoutError:
            return StandbyAnswer(status="pending")
        return StandbyAnswer(status="run", env=env) if env else StandbyAnswer(status="exit")

    async def close(self) -> None:
        """Stop every standby not taken (SIGTERM, SIGKILL after the grace period) and wait for
        them to end (up to another grace period)."""
        standbys = list(self._standbys.values())  # one still starting ends once started
        for standby in standbys:
            self._stop(standby, "the job ends")
        ends = [asyncio.ensure_future(s.ended.wait()) for s in standbys]
        if ends:
            _, late = await asyncio.wait(ends, timeout=2 * self._stop_grace)
            for end in late:
                end.cancel()
        for task in self._tasks - self._workers:  # a taken one's watch is its worker's wait
            if not task.done():
                task.cancel()

    # --- one standby's life --------------------------------------------------------------------

    def _start(self, hostname: str) -> None:
        serial = self._next_serial()
        standby = Standby(f"{hostname}#standby.{serial}", hostname, serial)
        self._standbys[standby.standby_id] = standby
        self.started += 1
        self._runs[standby.standby_id] = self._spawn(self._run(standby))

    async def _run(self, standby: Standby) -> None:
        env = self._environment(standby.standby_id, standby.hostname)
        env.update({
            STANDBY_ID: standby.standby_id,
            STANDBY_COMMAND: self._command_json,
            STANDBY_PRELOAD: self._preload,
        })  # fmt: skip
        try:
            process = await self._launch(
                standby.hostname, standby.serial, self._located(standby), env
            )
        except (LaunchError, UsageError) as error:
            self._standbys.pop(standby.standby_id, None)
            self._failed_early(standby.hostname, f"cannot start: {error}")
            standby.ended.set()
            return
        standby.process = process
        standby.launcher_pid = standby.launcher_pid or process.pid or None
        standby.log_dir = standby.log_dir or process.log_dir
        if standby.standby_id not in self._standbys and not standby.taken:  # stopped meanwhile
            process.terminate()
        standby.exit_code = await process.wait()
        standby.ended.set()
        if standby.taken:
            self._taken.pop(standby.standby_id, None)
            return
        self._standbys.pop(standby.standby_id, None)
        if not standby.ready and not standby.given.done():
            self._failed_early(
                standby.hostname,
                f"ended with exit code {standby.exit_code} before it was ready"
                f"{await _last_error_line(process)}",
            )
        elif not standby.given.done():
            log.info("standby %s ended with exit code %d before it was used",
                     standby.standby_id, standby.exit_code)  # fmt: skip

    def _stop(self, standby: Standby, why: str) -> None:
        """SIGTERM a standby not taken (SIGKILL after the grace period); its poll says exit."""
        self._standbys.pop(standby.standby_id, None)
        if not standby.given.done():
            standby.given.set_result(None)
        log.debug("stopping standby %s: %s", standby.standby_id, why)
        if standby.process is not None and standby.exit_code is None:
            standby.process.terminate()
            self._spawn(self._kill_late(standby))

    async def _kill_late(self, standby: Standby) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(standby.ended.wait(), self._stop_grace)
            return
        if standby.process is not None:
            standby.process.kill()

    def _failed_early(self, hostname: str, why: str) -> None:
        failures = self._failures[hostname] = self._failures.get(hostname, 0) + 1
        if failures < FAILURES_TO_GIVE_UP:
            log.warning("a standby on host %s %s", hostname, why)
            return
        self._given_up.add(hostname)
        log.warning("no more standbys on host %s: %d in a row failed; the last %s",
                    hostname, failures, why)  # fmt: skip

    def _located(self, standby: Standby) -> Located:
        def located(pid: int, folder: str) -> None:
            standby.launcher_pid, standby.log_dir = pid, folder
            if standby.on_located is not None:
                standby.on_located(pid, folder)

        return located

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._workers.discard(task)
        for standby_id, watch in list(self._runs.items()):
            if watch is task:
                del self._runs[standby_id]


async def _last_error_line(process: WorkerProcess) -> str:
    """': <its last line of error output>' when there is one to read, else ''."""
    tail = b""
    if process.log_dir is not None:
        with contextlib.suppress(OSError), open(os.path.join(process.log_dir, "stderr"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            tail = f.read()
    elif (reader := getattr(process, "stderr", None)) is not None:
        with contextlib.suppress(Exception):
            tail = (await asyncio.wait_for(reader.read(), 1.0))[-TAIL_BYTES:]
    lines = [line for line in tail.decode(errors="replace").splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""
