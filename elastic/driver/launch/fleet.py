"""The job's worker processes: numbering, starting, output, exits, adoption, stopping."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.journal.resume import ADOPT_GRACE
from elastic.driver.launch.detached import (
    AdoptedProcess,
    keepers_under,
    kill_keeper,
    prepare_log_dir,
)
from elastic.driver.launch.follower import OutputFollower
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.launcher import Adoption, HostFolder, Located, WorkerProcess, WorkerSpec
from elastic.driver.launch.output import OutputSink, pump
from elastic.driver.launch.standbys import Standby, StandbyPool
from elastic.driver.logs import WorkerLines
from elastic.driver.reports import Reports, WorkerExited
from elastic.driver.workers import Worker, stop_workers
from elastic.protocol.http import SlotInfo
from elastic.protocol.python_command import STANDBY_MODULE, standby_command

log = logging.getLogger("elasticrun")

SlotOf = Callable[[str], SlotInfo | None]  # a worker's slot in the current round, if any


class Fleet:
    """The job's worker processes, by id, in launch order: every live one it launched or
    adopted, and ended ones until the job's `WorkerHistory` drops them.

    `start` and `adopt` begin watching a worker: its output is shown (from its pipes, from
    its files when detached here, relayed by its ssh agent when detached on another host)
    and, once it ends, its exit code is set and `WorkerExited` is reported, the only way the
    fleet speaks to the job. Of a detached worker's output, the bytes shown are counted in
    `Worker.offsets`, so that a restarted driver shows the rest. `stop` ends a worker for good
    (SIGTERM, then SIGKILL after the grace period); `close` stops every worker, or with
    `abandon` leaves them running for another driver, and ends the watching.

    With `keep_standbys`, `standbys` keeps warm standby processes on the job's hosts, and a
    worker made with `new_worker(..., standby=True)` starts in a ready one where its host has
    one (see `launch/standbys.py`); they end with the fleet, taken or not.
    """

    def __init__(
        self,
        hosts: HostAccess,
        reports: Reports,
        slot_of: SlotOf,
        log_root: str,
        output_dir: str | None,
        stop_grace: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        job_id: str,
        lines: WorkerLines | None = None,
    ) -> None:
        """`log_root`: where this host's detached workers write (`job_id` names the folders
        of remote ones, on their hosts); `lines`: how their output lines are shown (default:
        Horovod's `[rank]<stdout>:line`)."""
        self.workers: dict[str, Worker] = {}
        self._job_id = job_id
        self.serial = 0  # the number the last new worker got
        self._reports = reports
        self._slot_of = slot_of
        self.log_root = log_root
        self._hosts = hosts
        self._output_dir = output_dir
        self._stop_grace = stop_grace
        self._lines = lines or WorkerLines()
        self._clock = clock
        self._follower = OutputFollower()  # detached workers' output files, all of them
        self._pumps: set[asyncio.Future[None]] = set()  # output being copied, until it ends
        self._tasks: set[asyncio.Task[None]] = set()
        self.standbys: StandbyPool | None = None  # see `keep_standbys`
        self._taking: dict[str, Standby] = {}  # worker id -> the standby it starts in

    def keep_standbys(
        self,
        per_host: int,
        command: list[str],
        preload: tuple[str, ...],
        environment: Callable[[str, str], dict[str, str]],
    ) -> None:
        """Keep `per_host` warm standbys for `command` on the hosts the job wants them on
        (`StandbyPool.keep`), each with the job's worker variables (`environment(id, host)`)
        and `preload` imported; workers started with `new_worker(..., standby=True)` take
        them. Stopped with the fleet."""
        python = standby_command(command)
        assert python is not None, "checked by the settings"
        self.standbys = StandbyPool(
            per_host, command, preload,
            launch=lambda host, serial, located, env: self.launch(
                host, serial, located, env, python
            ),
            environment=environment, next_serial=self.next_serial,
            stop_grace=self._stop_grace,
        )  # fmt: skip

    def alive(self) -> list[Worker]:
        """The workers started and not ended (launching, members, leaving)."""
        return [w for w in self.workers.values() if w.state.alive and w.process is not None]

    def new_worker(self, hostname: str, host_slot: int, standby: bool = False) -> Worker:
        """A record for a worker about to start on `hostname`'s slot `host_slot`; with
        `standby`, one that `start` hands to a ready standby on that host when there is one
        (it takes the standby's number, which names its folder)."""
        taken = self.standbys.take(hostname) if standby and self.standbys else None
        if taken is None:
            self.serial += 1
        serial = taken.serial if taken is not None else self.serial
        worker_id = f"{hostname}[{host_slot}]#{serial}"
        worker = Worker(worker_id, hostname, host_slot, process=None)
        worker.launched_at = self._clock()
        self.workers[worker_id] = worker
        if taken is not None:
            self._taking[worker_id] = taken
        return worker

    def next_serial(self) -> int:
        """A new number in the job's worker numbering (a standby's, until a worker takes it)."""
        self.serial += 1
        return self.serial

    async def start(self, worker: Worker, command: list[str], env: dict[str, str]) -> None:
        """Start `worker`'s process (or hand it the standby `new_worker` took for it) and
        watch it; raises `LaunchError` if it cannot start (a planted log folder, an
        unreachable host, a command that cannot run)."""
        standby = self._taking.pop(worker.worker_id, None)
        if standby is not None:  # before any await: the standby cannot end unseen meanwhile
            worker.process = StandbyPool.hand_over(standby, env, self._located(worker))
            worker.launcher_pid, worker.log_dir = standby.launcher_pid, standby.log_dir
            log.debug("worker %s runs in standby %s", worker.worker_id, standby.standby_id)
        else:
            located = self._located(worker)
            worker.process = await self.launch(
                worker.hostname, int(worker.serial), located, env, command, worker.host_slot
            )
            worker.log_dir = worker.process.log_dir or worker.log_dir
            # 0 for a remote detached one until its agent says (`located` records it then)
            worker.launcher_pid = worker.process.pid or worker.launcher_pid
        self._watch(worker)

    async def launch(
        self,
        hostname: str,
        serial: int,
        located: Located,
        env: dict[str, str],
        command: list[str],
        host_slot: int | None = None,
    ) -> WorkerProcess:
        """Start process `serial` (a worker or a standby) on `hostname`: detached, in its
        own folder (private, 0700, this user's: a planted folder or link raises
        `LaunchError`), where the job's workers outlive the driver."""
        log_dir, host_folder = None, None
        if self._hosts.detached(hostname):
            if self._hosts.is_local(hostname):
                log_dir = prepare_log_dir(self.log_root, serial)
            else:  # its agent prepares the folder over there, and says where it is
                host_folder = HostFolder(self._job_id, serial, host_slot)
        spec = WorkerSpec(
            hostname=hostname,
            command=command,
            env=env,
            cwd=os.getcwd(),
            log_dir=log_dir,
            host_folder=host_folder,
            located=located if host_folder is not None else None,
        )
        return await self._hosts.launcher(hostname).launch(spec)

    def adopt(self, workers: list[Worker]) -> None:
        """Watch `workers`, which earlier drivers launched, as if this one had; then stop the
        job's strays: keepers that no saved record names, launched by an earlier driver after
        its last save (nothing would ever stop one; a stopped one would never even exit).

        Local strays are found here; remote ones by the first attach session to their host,
        so a host where no worker is adopted keeps its strays. A worker whose host cannot be
        reached (or its name looked up) is lost: it ends at once, exit code unknown.
        """
        here: dict[str, set[int]] = {}
        for worker in workers:
            here.setdefault(worker.hostname, set()).add(int(worker.serial))
        now = self._clock()
        for worker in workers:
            adoption = Adoption(
                hostname=worker.hostname,
                host_folder=HostFolder(self._job_id, int(worker.serial)),
                pid=worker.launcher_pid,
                log_dir=worker.log_dir,
                offsets=dict(worker.offsets),
                adopted_here=frozenset(here[worker.hostname]),
                last_serial=self.serial,
                located=self._located(worker),
            )
            try:
                worker.process = self._hosts.launcher(worker.hostname).adopt(adoption)
            except (LaunchError, UsageError) as error:
                log.error("cannot re-adopt worker %s: %s", worker.worker_id, error)
                worker.process = AdoptedProcess(None, None)  # ended, exit code unknown
            worker.launched_at = now
            worker.last_heartbeat = now + ADOPT_GRACE  # it has to find this driver first
            # Heard before (it registered or beat in a round): judged by heartbeats after
            # that grace; one that never did may still be starting (the start timeout).
            worker.heard = worker.registered or worker.joined
            self._watch(worker)
        self._stop_strays()

    def _stop_strays(self) -> None:
        """Kill the local keepers of the job that no adopted worker's record names."""
        adopted = {w.log_dir for w in self.workers.values() if w.process is not None}
        for pid, folder in keepers_under(self.log_root).items():
            if folder in adopted:
                continue
            if _runs_standby(pid):  # standbys end with the driver that started them
                log.info("stopping %s (keeper pid %d): a standby of the earlier driver (or a "
                         "worker started in one after its last save)",
                         os.path.basename(folder), pid)  # fmt: skip
            else:
                log.warning(
                    "stopping %s (keeper pid %d): the earlier driver launched it after its "
                    "last save",
                    os.path.basename(folder),
                    pid,
                )
            kill_keeper(pid)

    @staticmethod
    def _located(worker: Worker) -> Located:
        """Records where a detached remote worker runs on its host, once its agent says."""

        def located(pid: int, folder: str) -> None:
            worker.launcher_pid, worker.log_dir = pid, folder

        return located

    def stop(self, worker: Worker) -> None:
        """SIGTERM `worker`, and SIGKILL it after the grace period (a stopped or hung
        process ignores SIGTERM until it is too late)."""
        if worker.process is not None:
            worker.process.terminate()
            self._spawn(self._kill_if_still_running(worker))

    async def close(self, abandon: bool = False) -> None:
        """Stop every running worker (with `abandon`, leave them running), show the rest of
        their output and stop watching."""
        for task in self._tasks:
            task.cancel()
        if self.standbys is not None:
            await self.standbys.close()
        if abandon:
            for source in list(self._pumps):
                source.cancel()
        else:
            await stop_workers(self.workers.values(), self._stop_grace)
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._follower.close()

    def _rank(self, worker: Worker) -> Callable[[], int | None]:
        """The rank `worker`'s output is shown with: its rank now, else the last it had."""
        last = None

        def rank() -> int | None:
            nonlocal last
            slot = self._slot_of(worker.worker_id)
            if slot is not None:
                last = slot.rank
            return last

        return rank

    def _watch(self, worker: Worker) -> None:
        # Its folder under --output-filename: named after its first rank, else its number.
        slot = self._slot_of(worker.worker_id)
        folder = f"rank.{slot.rank}" if slot is not None else f"worker.{worker.serial}"
        rank = self._rank(worker)
        process = worker.process
        assert process is not None
        for stream in ("stdout", "stderr"):
            shape = self._lines.shaper(stream, rank, worker.hostname, worker.worker_id)
            sink = OutputSink(shape, stream, self._output_dir, folder)
            offset, count = worker.offsets.get(stream, 0), self._counter(worker, stream)
            if process.log_dir is not None:  # detached here: its files
                source = self._follower.add(
                    os.path.join(process.log_dir, stream),
                    sink,
                    offset,
                    ended=lambda: worker.exit_code is not None,
                    at=count,
                )
            elif (reader := getattr(process, stream, None)) is not None:
                if process.detached:  # relayed from its files over there
                    source = asyncio.create_task(pump(reader, sink, offset, count))
                else:
                    source = asyncio.create_task(pump(reader, sink))
            else:  # adopted with nothing to show
                sink.close()
                continue
            self._pumps.add(source)
            source.add_done_callback(self._pumps.discard)
        self._spawn(self._await_exit(worker))

    @staticmethod
    def _counter(worker: Worker, stream: str) -> Callable[[int], None]:
        """Records up to which byte `stream` of `worker` was shown."""
        return lambda offset: worker.offsets.__setitem__(stream, offset)

    async def _await_exit(self, worker: Worker) -> None:
        worker.exit_code = await worker.process.wait()
        worker.ended_at = self._clock()
        self._follower.poke()  # its output files are drained now, not at the next look
        self._reports.put_nowait(WorkerExited(worker))

    async def _kill_if_still_running(self, worker: Worker) -> None:
        await asyncio.sleep(self._stop_grace)
        if worker.exit_code is None and worker.process is not None:
            worker.process.kill()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _runs_standby(pid: int) -> bool:
    """Whether keeper `pid` runs a standby (its command line names the standby's module)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return STANDBY_MODULE.encode() in cmdline.read().split(b"\0")
    except OSError:
        return False
