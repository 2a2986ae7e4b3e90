"""The driver's real parts, in this process, replacing killed workers over and over.

Real conductor, fleet, staffing, rendezvous (its joins included), round keeper, control
channels, host watcher and key-value store, wired as `elastic.driver.job.Job` wires them;
`describe_job`, `snapshot` and `JobMetrics` read them as `/v1/status`, the journal and a
scrape do. Only the worker processes are simulated (`SimulatedProcess`, started by
`SimulatedLauncher`): a kill ends one with 137 (SIGKILL), as a real one's keeper reports it;
no process, socket or thread is made.

One `replace_one()` is what a user sees when one worker of the job is SIGKILLed: the
driver hears its exit, breaks the round and launches a replacement; the survivors come back
to the rendezvous and round n+1 forms without the dead one; the replacement joins and round
n+2 holds every slot again.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.conductor import Conductor
from elastic.driver.control.channels import ControlChannels
from elastic.driver.discovery import FixedHosts, HostTracker
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.journal.resume import snapshot
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.launcher import Launcher, WorkerProcess, WorkerSpec
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.launch.staffing import Staffing
from elastic.driver.observe.prometheus import JobMetrics
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.reports import Joined, Reports, Waiting
from elastic.driver.server.status import describe_job
from elastic.driver.settings import ElasticSettings, FailureScope, Settings
from elastic.driver.workers import WorkerState
from elastic.protocol.http import HostStatus, JobStatus

HOST = "localhost"
JOIN_TIMEOUT = 30.0  # seconds a simulated worker waits at the rendezvous
SETTLE_TURNS = 100_000  # event loop turns a step may take before the harness gives up


class SimulatedProcess(WorkerProcess):
    """A worker process that runs until it is killed or stopped (no output)."""

    _pids = itertools.count(10_000)

    def __init__(self) -> None:
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pid = next(self._pids)
        self._signal: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def signal(self) -> int | None:
        return self._signal

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def _end(self, number: int) -> None:
        if not self._ended.done():
            self._signal = number
            self._ended.set_result(128 + number)

    def terminate(self) -> None:
        self._end(15)

    def kill(self) -> None:
        self._end(9)


class SimulatedLauncher(Launcher):
    """Starts `SimulatedProcess`es; `started[worker_id]` is each one (the environment's
    `WORKER_ID` names it)."""

    def __init__(self) -> None:
        self.started: dict[str, SimulatedProcess] = {}

    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        process = SimulatedProcess()
        self.started[spec.env["WORKER_ID"]] = process
        return process


class ChurningDriver:
    """The driver of an elastic job of `size` workers on one host, --failure-scope worker,
    no cooldown, `history` ended workers kept (--worker-history). Build it on the event
    loop, `await start()`, then `await replace_one()` as often as wanted."""

    def __init__(self, size: int = 4, history: int = 32) -> None:
        self.size = size
        self.settings = Settings(
            np=size, hosts=[HostSpec(HOST, size)], command=["train.py"],
            elastic=ElasticSettings(1, size, None, cooldown_range=(0.0, 0.0),
                                    failure_scope=FailureScope.WORKER),
            worker_history=history,
        )  # fmt: skip
        self.reports: Reports = asyncio.Queue()
        self.launcher = SimulatedLauncher()
        self.hosts = HostAccess(SshOptions(), 1.0, 5.0, local_launcher=self.launcher)
        self.rendezvous = Rendezvous(
            on_wait=lambda w, after, commit: self.reports.put_nowait(Waiting(w, after, commit)),
            on_join=lambda w, _: self.reports.put_nowait(Joined(w)),
        )
        self.fleet = Fleet(
            self.hosts, self.reports, self.rendezvous.slot_of, "/nonexistent", None, 1.0,
            job_id="churn",
        )  # fmt: skip
        self.watcher = HostWatcher(
            FixedHosts(self.settings.hosts),
            HostTracker(Cooldown(0.0, 0.0, random.Random(0))),
            self.hosts,
            self.reports,
            1.0,
            asyncio.get_running_loop().time,
        )
        staffing = Staffing(
            self.fleet, self.hosts, ["train.py"], lambda w: {"WORKER_ID": w.worker_id},
            True, self.watcher.host_failed,
        )  # fmt: skip
        self.ended: list[tuple[int, str | None]] = []
        self.errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.conductor = Conductor(
            self.settings, fleet=self.fleet, staffing=staffing, rendezvous=self.rendezvous,
            channels=ControlChannels(), kv=MemoryKeyValueStore(), watcher=self.watcher,
            save_soon=lambda: None, spawn=self.spawn,
            finish=lambda code, message: self.ended.append((code, message)),
            clock=asyncio.get_running_loop().time,
        )  # fmt: skip
        self.metrics = JobMetrics()
        self.replaced = 0

    async def start(self) -> None:
        """Discover the host, launch `size` workers and form round 1 with them."""
        await self.hosts.learn([HOST])
        self.watcher.tracker.discovered(self.settings.hosts, 0.0)
        self.spawn(self._hear())
        workers = [self.fleet.new_worker(HOST, slot) for slot in range(self.size)]
        self.rendezvous.form([(w.worker_id, w.hostname) for w in workers])
        for worker in workers:
            worker.state = WorkerState.MEMBER
            await self.fleet.start(worker, ["train.py"], {"WORKER_ID": worker.worker_id})

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    async def _hear(self) -> None:
        while True:
            self.conductor.hear(await self.reports.get())

    async def replace_one(self) -> None:
        """SIGKILL one member (in turn, by rank) and wait until its replacement is a member
        of a round of `size` again."""
        number = self.rendezvous.round
        members = list(self.rendezvous.members)
        victim = self.fleet.workers[members[self.replaced % len(members)]]
        survivors = [m for m in members if m != victim.worker_id]
        launched = len(self.launcher.started)
        self.launcher.started[victim.worker_id].kill()
        await self._until(
            lambda: victim.state is WorkerState.FAILED and len(self.launcher.started) > launched,
            "the death heard and a replacement launched",
        )
        await self._join(survivors, number)  # round n+1: the survivors
        (joiner,) = [w for w in self.fleet.alive() if w.state is WorkerState.LAUNCHING]
        await self._join([joiner.worker_id], 0)  # round n+2: every slot again
        self.launcher.started.pop(victim.worker_id)
        self.replaced += 1
        if self.ended or self.errors:
            raise AssertionError(f"the job ended {self.ended} or failed: {self.errors!r}")

    async def _join(self, worker_ids: list[str], after: int) -> None:
        joins = [
            asyncio.ensure_future(self.rendezvous.join(w, after, JOIN_TIMEOUT)) for w in worker_ids
        ]
        await self._until(lambda: all(j.done() for j in joins), f"{worker_ids} joined")
        for join in joins:
            assert join.result() is not None, "a join timed out"

    async def _until(self, condition: Callable[[], bool], what: str) -> None:
        for _ in range(SETTLE_TURNS):
            if condition():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"waited in vain for {what}")

    def status(self) -> JobStatus:
        """What `/v1/status` answers now (`Job.status` with this job's parts)."""
        conductor = self.conductor
        return describe_job(
            "churn",
            self.rendezvous,
            self.fleet.workers.values(),
            [HostStatus(hostname=HOST, slots=self.size)],
            conductor.decisions,
            now=asyncio.get_running_loop().time(),
            rounds=conductor.timeline.records(),
            stall=conductor.stalls.stall,
            ended=conductor.history.counts(),
        )

    def saved_state(self) -> bytes:
        """The `state` document the journal saves now (`Job._snapshot`)."""
        conductor = self.conductor
        return snapshot(
            self.rendezvous, self.fleet.workers.values(), self.watcher.tracker, conductor.tally,
            self.fleet.serial, False, 0.0, conductor.history.dropped,
        )  # fmt: skip

    def scrape(self) -> bytes:
        """A Prometheus scrape's answer now."""
        return self.metrics.exposition(self.status(), dict(self.conductor.timeline.reforms), 0.0)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fleet.close(abandon=True)
