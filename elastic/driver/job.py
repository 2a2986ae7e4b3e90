"""One job's lifecycle: build its parts, serve, launch the first round, resume, end.

A static job (no discovery, no `--min-np`) is the degenerate elastic job: its hosts are fixed
and the first failure ends it. An elastic job re-forms after every failure, join and leave.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
import signal
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.conductor import Conductor
from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.inputs import WorkerInputs
from elastic.driver.control.liveness_watch import LivenessWatch
from elastic.driver.discovery import FixedHosts, HostDiscovery, HostTracker, ScriptDiscovery
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.job_file import remove_job_file, urls_of, write_job_file
from elastic.driver.journal.backend import StateBackend
from elastic.driver.journal.job_token import GivenToken, find_token
from elastic.driver.journal.journal import JobJournal, backend_for
from elastic.driver.journal.memory import MemoryBackend
from elastic.driver.journal.record import JobSpec
from elastic.driver.journal.resume import (
    Tally,
    restore_hosts,
    resumed,
    settings_document,
    snapshot,
)
from elastic.driver.launch.detached import default_log_root
from elastic.driver.launch.environment import WorkerEnvironments
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.launcher import Launcher
from elastic.driver.launch.staffing import Staffing, host_summary
from elastic.driver.logs import LogTail, WorkerLines, tags
from elastic.driver.observe.loop_lag import LoopLag
from elastic.driver.observe.prometheus import JobMetrics
from elastic.driver.observe.timeline import RoundTimeline
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.liveness import Limits
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.planning import first_places
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.reports import (
    DrainAsked,
    Joined,
    KeysLost,
    Reports,
    StopAsked,
    Waiting,
)
from elastic.driver.server.endpoints import Endpoints
from elastic.driver.server.services import Services
from elastic.driver.server.status import describe_job
from elastic.driver.settings import Settings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import HostStatus, JobStatus, StandbyAnswer

log = logging.getLogger("elasticrun")


class Job:
    """Owns one job's lifecycle, from launch to its end; between the two, its parts report to
    one queue and the `Conductor` acts on each report.

    `run()` returns the launcher's exit code: 0 when every worker of the current round exits
    0; in a static job the first failing worker's code (the others are stopped: SIGTERM, then
    SIGKILL after the grace period); in an elastic job 1 when a limit ends it (elastic
    timeout, reset limit) or the last failure's code when every worker failed; 128+N when the
    launcher itself received signal N. It raises `LaunchError` when the job cannot start. No
    worker outlives `run()`, except when this driver lost its job to another one.

    Collaborators not passed in are built from the settings: `hosts` reaches hosts and
    launches on them (with `launcher`, if given, for every host), `discovery` finds hosts,
    `backend` keeps the job's state (a driver started again with the same job id after this
    one died takes the job up from it and re-adopts the running workers), `clock` is
    monotonic time.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backend: StateBackend | None = None,
        hosts: HostAccess | None = None,
        discovery: HostDiscovery | None = None,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = settings.backend.job_id or uuid.uuid4().hex[:12]
        self._driver_id = uuid.uuid4().hex
        self._journal = JobJournal(
            backend if backend is not None else MemoryBackend(),
            self.job_id,
            self._driver_id,
            settings.backend.grace,
            self._lost_job,
        )
        given = settings.backend.token  # --token-file, $ELASTICRUN_TOKEN
        self._token = given.token if given is not None else secrets.token_urlsafe(32)
        self._clock = clock
        self._kv = MemoryKeyValueStore()
        self._reports: Reports = asyncio.Queue()
        self._rendezvous = Rendezvous(
            on_wait=lambda w, after, commit: self._reports.put_nowait(Waiting(w, after, commit)),
            on_join=lambda w, _: self._reports.put_nowait(Joined(w)),
        )
        self._channels = ControlChannels()
        self._tasks: set[asyncio.Task[None]] = set()
        self._result: asyncio.Future[int] | None = None
        self._end_message = ""
        self._endpoints: Endpoints | None = None
        self._environments: WorkerEnvironments | None = None  # once the endpoints serve
        self._loop_lag = LoopLag(clock=clock)
        self._log_tail = LogTail()  # the launcher's newest lines, for `status()`
        self.metrics = JobMetrics()
        self._given = (hosts, discovery, launcher)
        self._configure(settings, default_log_root(self.job_id))

    @classmethod
    def from_settings(cls, settings: Settings) -> Job:
        """A job with the collaborators its settings name (the state backend among them)."""
        return cls(settings, backend=backend_for(settings.backend))

    def _configure(self, settings: Settings, log_root: str) -> None:
        self.settings, self.elastic = settings, settings.elastic
        hosts, discovery, launcher = self._given
        self._hosts = hosts or HostAccess(
            settings.ssh, settings.stop_grace, settings.start_timeout,
            detached=settings.backend.durable, local_launcher=launcher, ssh_launcher=launcher,
        )  # fmt: skip
        self._fleet = Fleet(
            self._hosts, self._reports, self._rendezvous.slot_of, log_root, settings.output_dir,
            settings.stop_grace, self._clock, job_id=self.job_id,
            lines=WorkerLines(settings.log_format, self.current_round),
        )  # fmt: skip
        self._workers = self._fleet.workers
        elastic = self.elastic
        low, high = elastic.cooldown_range if elastic else (0.0, 0.0)
        if discovery is None and elastic is not None and elastic.discovery_script:
            discovery = ScriptDiscovery(
                elastic.discovery_script, elastic.discovery_timeout, elastic.slots_per_host
            )
        self._watcher = HostWatcher(
            discovery or FixedHosts(settings.hosts),
            HostTracker(Cooldown(low, high, random.Random())),
            self._hosts,
            self._reports,
            elastic.discovery_interval if elastic else 1.0,
            self._clock,
        )
        self._staffing = Staffing(
            self._fleet, self._hosts, settings.command, self._environment,
            settings.elastic is not None, self._watcher.host_failed,
        )  # fmt: skip
        self._conductor = Conductor(
            settings, fleet=self._fleet, staffing=self._staffing, rendezvous=self._rendezvous,
            channels=self._channels, kv=self._kv, watcher=self._watcher,
            save_soon=self._journal.save_soon, spawn=self._spawn, finish=self._finish,
            clock=self._clock,
            timeline=RoundTimeline(self._clock, on_recovery=self.metrics.recovered),
        )  # fmt: skip

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        self._result = asyncio.get_running_loop().create_future()
        started = self._clock()
        documents = await self._journal.claim()
        logging.getLogger().addHandler(self._log_tail)  # every line the launcher shows
        try:
            code = await self._run(documents)
            log.info("%s", self._summary(code, self._clock() - started), extra={"event": "end"})
            return code
        finally:
            await self._record_result()
            await self._journal.close()
            logging.getLogger().removeHandler(self._log_tail)

    async def _run(self, documents: dict[str, bytes]) -> int:
        assert self._result is not None
        resuming = "state" in documents
        if resuming:
            token = await asyncio.to_thread(  # it may ask at the terminal
                find_token, self.job_id, self.settings.backend.token, "to take it up"
            )
            self._restore(documents, token)
            hosts = list(self._watcher.tracker.hosts if self.elastic else self.settings.hosts)
        elif self.elastic is not None:
            needed = self.elastic.min_np
            wanted = self.settings.np or needed  # -np lies in --min-np..--max-np
            timeout = self.settings.start_timeout
            hosts = await self._watcher.first_hosts(wanted, needed, timeout)
        else:
            hosts = list(self.settings.hosts)
        await self._hosts.learn(h.hostname for h in hosts)  # DNS, off the event loop
        services = Services(
            self._token, self._kv, self._rendezvous, self.status, durable=self._journal.flush,
            newest_commit=lambda: self._conductor.tally.newest_commit,
            keys_lost=lambda number: self._reports.put_nowait(KeysLost(number)),
            metrics=self._scrape, set_drained=self.set_drained,
            stop_job=lambda: self._reports.put_nowait(StopAsked()),
            standby_wait=self._standby_wait,
        )  # fmt: skip
        inputs = WorkerInputs(
            self._workers, self._channels, self._reports, lambda: self._rendezvous.round,
            self._clock, first_step=self._first_step,
        )  # fmt: skip
        address = self._hosts.bind_address(hosts, self.settings.network_interface)
        self._endpoints = endpoints = Endpoints(self.settings, address, services, inputs)
        await endpoints.start()
        self._environments = WorkerEnvironments(
            self.settings, endpoints, job_id=self.job_id, token=self._token
        )
        if self.elastic is not None and self.elastic.standby:
            environments = self._environments
            self._fleet.keep_standbys(
                self.elastic.standby, list(self.settings.command), self.elastic.preload,
                lambda worker_id, hostname: environments.of(worker_id, hostname, None),
            )  # fmt: skip
        tls_cert = endpoints.address(self._driver_id).tls_cert
        job_file = write_job_file(
            self.job_id, self._token, endpoints.url, tls_cert,
            durable=self.settings.backend.durable,
        )  # fmt: skip
        (log.info if self.elastic else log.debug)(
            "job %s: `elasticrun status --job-id %s` (also drain, undrain, stop); metrics at "
            "%s/metrics; its token is in %s", self.job_id, self.job_id, endpoints.url, job_file,
        )  # fmt: skip
        try:
            await self._publish(new=not resuming)
            if resuming:
                self._adopt()
            else:
                await self._launch_first_round(hosts)
            endpoints.announce_page(self.job_id)  # after the checks a bad command line fails
            self._spawn(self._hear_reports())
            limits = Limits(
                self.settings.heartbeat_interval, self.settings.stop_grace,
                self.settings.start_timeout,
            )  # fmt: skip
            watch = LivenessWatch(
                self._fleet.alive, limits, self._reports, self._clock, self._loop_lag.record
            )
            self._spawn(watch.run())
            if self.elastic is not None:
                self._spawn(self._watcher.run())
            return await self._result
        finally:
            for task in self._tasks:
                task.cancel()
            self._conductor.rounds.cancel()
            await self._fleet.close(abandon=self._conductor.phase is Phase.ABANDONED)
            await endpoints.stop()
            ended = self._result.done() and self._conductor.phase is not Phase.ABANDONED
            if ended or not self.settings.backend.durable:
                remove_job_file(job_file)  # else it keeps the token for the job's next driver

    async def _hear_reports(self) -> None:
        while True:
            self._conductor.hear(await self._reports.get())

    def _lost_job(self) -> None:
        self._conductor.phase = Phase.ABANDONED
        self._finish(
            1,
            f"another driver took job {self.job_id} over (this driver's claim expired): "
            "leaving the workers to it",
        )

    def _finish(self, code: int, message: str | None = None) -> None:
        """End the job with `code` (the first call wins), logging `message`."""
        if self._conductor.phase is not Phase.ABANDONED:
            self._conductor.phase = Phase.ENDED  # no more rounds or launches while the job ends
        self._rendezvous.close()  # workers re-joining now are told to leave
        if self._result is not None and not self._result.done():
            if message:
                (log.error if code else log.info)("%s", message, extra=tags("end"))
            self._end_message = message or ""
            self._result.set_result(code)

    def request_stop(self, signum: int) -> None:
        """Called on SIGINT/SIGTERM: stop every worker and end the job with 128+signum."""
        self._finish(128 + signum, f"received {signal.Signals(signum).name}: stopping all workers")

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            if isinstance(error, UsageError | LaunchError):
                self._finish(1, str(error))
            else:
                log.error("driver error: %r", error, exc_info=error)
                self._finish(1, f"driver error: {error!r}")

    # --- what outlives the driver ----------------------------------------------------------

    async def _publish(self, new: bool) -> None:
        assert self._endpoints is not None
        spec = None
        if new:
            spec = JobSpec(
                job_id=self.job_id, created=time.time(),
                settings=settings_document(self.settings), log_root=self._fleet.log_root,
            )  # fmt: skip
        address = self._endpoints.address(self._driver_id)
        await self._journal.publish(address, self._token, spec, self._snapshot, self._spawn)

    def _snapshot(self) -> bytes:
        return snapshot(
            self._rendezvous, self._workers.values(), self._watcher.tracker,
            self._conductor.tally, self._fleet.serial, not self._conductor.phase.forms_rounds,
            time.time() - self._clock(), self._conductor.history.dropped,
        )  # fmt: skip

    def _restore(self, documents: dict[str, bytes], token: GivenToken) -> None:
        """Take the job up as the saved documents describe it (the saved settings win), once
        they verify with `token`; raises `LaunchError` (one line) before acting otherwise."""
        saved = resumed(
            documents, self.settings.backend, self.job_id, token, self._journal.backend.key_of
        )
        if self.settings.command and self.settings.command != saved.settings.command:
            log.warning(
                "job %s runs %s (as first started); ignoring this command line's command",
                self.job_id,
                " ".join(saved.settings.command),
            )
        mine = self.settings.log_format  # how this driver's lines look is its own choice
        self._configure(dataclasses.replace(saved.settings, log_format=mine), saved.log_root)
        self._token, state = saved.token, saved.state
        self._fleet.serial = state.serial
        self._workers.update((w.worker_id, w) for w in saved.workers)
        self._rendezvous.restore(
            state.round, [(w, self._workers[w].hostname) for w in state.members]
        )
        for worker in saved.workers:  # let go (`LetGo`) by the dead driver: its joins are
            if worker.state is WorkerState.LEAVING and not worker.handing_over:  # turned away
                self._rendezvous.exclude(worker.worker_id)
        restore_hosts(self._watcher.tracker, state, time.time() - self._clock(), self._clock())
        tally = Tally(state.resets, state.update_version, state.newest_commit)
        self._conductor.resume(tally, state.finishing)
        self._conductor.history.restore(state.ended_by_state, state.ended_by_cause)
        alive = sum(1 for w in saved.workers if w.state.alive)
        log.info(
            "resuming job %s at round %d: %d worker(s) to re-adopt", self.job_id, state.round,
            alive,
        )  # fmt: skip

    def _adopt(self) -> None:
        """Watch the workers an earlier driver launched, as if this one had; finish stopping
        those it was stopping when it died."""
        workers = self._workers.values()
        stopping = [w for w in workers if w.state is WorkerState.STOPPED and w.exit_code is None]
        self._fleet.adopt([w for w in workers if w.state.alive] + stopping)
        for worker in stopping:
            self._conductor.stop(worker)

    async def _record_result(self) -> None:
        """Save how the job ended (not when this driver merely lost it)."""
        abandoned = self._conductor.phase is Phase.ABANDONED
        if abandoned or self._result is None or not self._result.done():
            return
        await self._journal.record_result(
            self._result.result(), self._end_message, self._snapshot()
        )

    # --- launching -------------------------------------------------------------------------

    async def _launch_first_round(self, hosts: list[HostSpec]) -> None:
        """Launch the first workers on `hosts` and form round 1 with them at once: -np of
        them in a static job, every offered slot up to --max-np in an elastic one."""
        max_np = self.elastic.max_np if self.elastic is not None else None
        places = first_places(hosts, self.settings.np, max_np, self.elastic is not None)
        workers = await self._staffing.place(places)
        self._rendezvous.form([(w.worker_id, w.hostname) for w in workers])
        self._conductor.timeline.formed(1, len(workers), Cause.START, "the job started")
        for worker in workers:
            worker.state = WorkerState.MEMBER
        self._journal.save_soon()
        await self._staffing.start_all(workers)
        (log.info if self.elastic else log.debug)(
            "round 1: %d worker(s) on %s", len(workers), host_summary(workers), extra=tags("round")
        )

    async def _scrape(self) -> bytes:
        """A scrape's answer: the job's state is read on the event loop, the text is made off
        it (a job of thousands of workers has a long one)."""
        status, reforms = self.status(), dict(self._conductor.timeline.reforms)
        lag = self._loop_lag.worst
        return await asyncio.to_thread(self.metrics.exposition, status, reforms, lag)

    def _first_step(self, number: int, at: float) -> None:
        self._conductor.timeline.first_step(number, at)

    async def _standby_wait(self, standby_id: str, timeout: float) -> StandbyAnswer:
        """A standby's long poll (`StandbyPool.wait`); `exit` when this job keeps none."""
        if self._fleet.standbys is None:
            return StandbyAnswer(status="exit")
        return await self._fleet.standbys.wait(standby_id, timeout)

    def _environment(self, worker: Worker) -> dict[str, str]:
        assert self._environments is not None
        return self._environments.of(
            worker.worker_id, worker.hostname, self._rendezvous.slot_of(worker.worker_id)
        )

    def _summary(self, code: int, seconds: float) -> str:
        """The job's last line for people: its exit code, wall time, rounds and re-forms by
        cause, and the most optimizer steps any worker took."""
        timeline = self._conductor.timeline
        reforms = sum(timeline.reforms.values())
        causes = ", ".join(f"{n} {cause}" for cause, n in timeline.reforms.most_common())
        steps = max((w.progress.activity.steps for w in self._workers.values()
                     if w.progress.activity is not None),
                    default=0)  # fmt: skip
        steps = max(steps, self._conductor.history.most_steps)
        return (
            f"job {self.job_id} ended with exit code {code} after {seconds:.1f} s: "
            f"{self._rendezvous.round} round(s), {reforms} re-form(s)"
            + (f" ({causes})" if causes else "")
            + f", {steps} step(s)"
        )

    def current_round(self) -> int | None:
        """The job's round now, for log lines: None before the first is formed."""
        return self._rendezvous.round or None

    @property
    def end_message(self) -> str:
        """The job's last line, once it has ended ("" for a clean end)."""
        return self._end_message

    def set_drained(self, hostname: str, drained: bool) -> str:
        """Drain or undrain `hostname` (see `Services.set_drained`)."""
        if self.elastic is None:
            raise ValueError(
                "a static job's hosts are fixed: drain needs elastic mode (--min-np or "
                "--host-discovery-script)"
            )
        tracker = self._watcher.tracker
        known = [h.hostname for h in tracker.discovered_hosts]
        if hostname not in known and hostname not in tracker.drained:
            raise LookupError(f"job {self.job_id} has no host {hostname!r} (it has: "
                              f"{', '.join(known) or 'none'})")  # fmt: skip
        self._reports.put_nowait(DrainAsked(hostname, drained))
        if not drained:
            return f"host {hostname} is undrained: its free slots are filled again"
        left = sum(h.slots for h in tracker.hosts if h.hostname != hostname)
        short = (
            f"; {left} slot(s) remain, fewer than --min-np {self.elastic.min_np}: the job "
            "waits for hosts (up to --elastic-timeout)"
            if left < self.elastic.min_np
            else ""
        )
        return (
            f"host {hostname} is drained: its workers leave at their next step, and it gets "
            f"no new ones until undrained{short}"
        )

    def status(self) -> JobStatus:
        now = self._clock()
        if self.elastic is not None:
            hosts = [
                HostStatus(hostname=spec.hostname, slots=spec.slots, state=state,
                           until=until - now + time.time() if until is not None else None)
                for spec, state, until in self._watcher.tracker.states(now)
            ]  # fmt: skip
        else:
            hosts = [HostStatus(hostname=h.hostname, slots=h.slots) for h in self.settings.hosts]
        status = describe_job(
            self.job_id,
            self._rendezvous,
            self._workers.values(),
            hosts,
            self._conductor.decisions,
            self.settings.checkpoint.directory,
            now=now,
            rounds=self._conductor.timeline.records(),
            stall=self._conductor.stalls.stall,
            urls=urls_of(self._endpoints.url) if self._endpoints is not None else None,
            log_tail=list(self._log_tail.lines),
            ended=self._conductor.history.counts(),
        )
        if (standbys := self._fleet.standbys) is not None:
            status.standbys, status.standbys_taken = standbys.describe(), standbys.taken
        return status
