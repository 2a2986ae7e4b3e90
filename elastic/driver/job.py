"""One job's lifecycle: serve the rendezvous, launch workers, hear their reports, re-form, end.

A static job (no discovery, no `--min-np`) is the degenerate elastic job: its hosts are fixed
and the first failure ends it. An elastic job re-forms after every failure, join and leave.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.inputs import WorkerInputs
from elastic.driver.control.liveness import LivenessWatch
from elastic.driver.discovery import FixedHosts, HostDiscovery, HostTracker, ScriptDiscovery
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.journal.backend import StateBackend
from elastic.driver.journal.journal import JobJournal, backend_for
from elastic.driver.journal.memory import MemoryBackend, MemoryKeyValueStore
from elastic.driver.journal.record import JobSpec
from elastic.driver.journal.resume import (
    Tally,
    default_log_root,
    restore_hosts,
    resumed,
    settings_document,
    snapshot,
)
from elastic.driver.launch.base import Launcher
from elastic.driver.launch.detached import AdoptedProcess
from elastic.driver.launch.environment import worker_environment
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.staffing import Staffing, first_places, host_summary
from elastic.driver.policy import leaving
from elastic.driver.policy import rounds as policy
from elastic.driver.policy import workers as on_workers
from elastic.driver.policy.liveness import Limits
from elastic.driver.policy.rounds import Decision, JobView, Phase
from elastic.driver.rendezvous.keeper import RoundKeeper
from elastic.driver.rendezvous.rounds import Rendezvous
from elastic.driver.reports import (
    Heard,
    HostsChanged,
    Joined,
    Judged,
    LeaveAsked,
    Report,
    Reports,
    Tick,
    Waiting,
    WorkerExited,
)
from elastic.driver.server.endpoints import Endpoints
from elastic.driver.server.services import Services
from elastic.driver.server.status import describe_job
from elastic.driver.settings import Settings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import DecisionRecord, JobStatus

log = logging.getLogger("elasticrun")

DECISIONS_KEPT = 50  # the newest decisions `/v1/status` shows
PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines


class Job:
    """Owns one job's lifecycle, from launch to its end; its parts report, `Job` decides.

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
        self._token = secrets.token_urlsafe(32)
        self._clock = clock
        self._kv = MemoryKeyValueStore()
        self._reports: Reports = asyncio.Queue()
        self._rendezvous = Rendezvous(
            on_wait=lambda w, after, commit: self._reports.put_nowait(Waiting(w, after, commit)),
            on_join=lambda w, _: self._reports.put_nowait(Joined(w)),
        )
        self._channels = ControlChannels()
        self._phase = Phase.RUNNING
        self._tally = Tally()
        self._short_since: float | None = None  # when the SHORT phase began
        self._failure_reported: set[int] = set()  # rounds a member said failed, unseen here
        self._commit_at_fleet_loss: int | None = None  # newest commit when all last died
        self._decisions: deque[DecisionRecord] = deque(maxlen=DECISIONS_KEPT)
        self._last_progress = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._result: asyncio.Future[int] | None = None
        self._end_message = ""
        self._endpoints: Endpoints | None = None
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
            settings.stop_grace, self._clock,
        )  # fmt: skip
        self._workers = self._fleet.workers
        self._rounds = RoundKeeper(
            self._rendezvous, self._channels, self._kv, self._workers,
            self._form_wanted_round, self._spawn,
        )  # fmt: skip
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

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        self._result = asyncio.get_running_loop().create_future()
        documents = await self._journal.claim()
        try:
            return await self._run(documents)
        finally:
            await self._record_result()
            await self._journal.close()

    async def _run(self, documents: dict[str, bytes]) -> int:
        assert self._result is not None
        resuming = "state" in documents
        if resuming:
            self._restore(documents)
            hosts = list(self._watcher.tracker.hosts if self.elastic else self.settings.hosts)
        elif self.elastic is not None:
            timeout = self.settings.start_timeout
            hosts = await self._watcher.first_hosts(self.elastic.min_np, timeout)
        else:
            hosts = list(self.settings.hosts)
        await self._hosts.learn(h.hostname for h in hosts)  # DNS, off the event loop
        services = Services(
            self._token, self._kv, self._rendezvous, self.status, durable=self._journal.flush,
            newest_commit=lambda: self._tally.newest_commit,
        )  # fmt: skip
        inputs = WorkerInputs(
            self._workers, self._channels, self._reports, lambda: self._rendezvous.epoch,
            self._clock,
        )  # fmt: skip
        address = self._hosts.bind_address(hosts, self.settings.network_interface)
        self._endpoints = endpoints = Endpoints(self.settings, address, services, inputs)
        await endpoints.start()
        try:
            await self._publish(new=not resuming)
            if resuming:
                self._adopt()
            else:
                await self._launch_first_round(hosts)
            self._spawn(self._hear_reports())
            limits = Limits(
                self.settings.heartbeat_interval, self.settings.stop_grace,
                self.settings.start_timeout,
            )  # fmt: skip
            self._spawn(LivenessWatch(self._fleet.alive, limits, self._reports, self._clock).run())
            if self.elastic is not None:
                self._spawn(self._watcher.run())
            return await self._result
        finally:
            for task in self._tasks:
                task.cancel()
            self._rounds.cancel()
            await self._fleet.close(abandon=self._phase is Phase.ABANDONED)
            await endpoints.stop()

    async def _hear_reports(self) -> None:
        while True:
            self._hear(await self._reports.get())

    def _hear(self, report: Report) -> None:
        """Act on one report of the job's parts."""
        now = self._clock()
        if isinstance(report, WorkerExited):
            self._channels.forget(report.worker.worker_id)
            ended_unwatched = _ended_unwatched(report.worker)
            self._apply(on_workers.exited(self._view(), report.worker, ended_unwatched, now))
        elif isinstance(report, Judged):
            timeout = self.settings.start_timeout
            verdict = report.verdict
            self._apply(on_workers.judged(self._view(), report.worker, verdict, timeout, now))
        elif isinstance(report, Tick):
            self._apply(policy.tick(self._view(), report.now))
        elif isinstance(report, Waiting):
            self._on_wait(report.worker_id, report.after, report.commit)
        elif isinstance(report, Joined):
            if (worker := self._workers.get(report.worker_id)) is not None:
                worker.joined = True
        elif isinstance(report, Heard):
            if self._workers[report.worker_id].state.alive:
                self._note_commit(self._workers[report.worker_id], report.commit)
                self._apply(on_workers.caught_up(self._view(), report.round))
        elif isinstance(report, LeaveAsked):
            worker = self._workers[report.worker_id]
            if worker.state.alive:  # its commit first: a restarted driver may not know it yet
                self._note_commit(worker, report.commit)
                self._apply(leaving.asked(self._view(), worker, report.reason))
        elif isinstance(report, HostsChanged):
            discovered = {h.hostname for h in self._watcher.tracker.discovered_hosts}
            self._apply(policy.hosts_removed(self._view(), report.change.removed, discovered))
            resized = {h.hostname: h.slots for h in report.change.hosts}
            slots = {name: resized[name] for name in report.change.resized}
            self._apply(policy.hosts_resized(self._view(), slots))
            if report.change.added:
                log.info("hosts available: %s", ", ".join(report.change.added))
            self._scale()

    def _lost_job(self) -> None:
        self._phase = Phase.ABANDONED
        self._finish(
            1,
            f"another driver took job {self.job_id} over (this driver's claim expired): "
            "leaving the workers to it",
        )

    def _finish(self, code: int, message: str | None = None) -> None:
        """End the job with `code` (the first call wins), logging `message`."""
        if self._phase is not Phase.ABANDONED:
            self._phase = Phase.ENDED  # no more rounds or launches while the job ends
        self._rendezvous.close()  # workers re-joining now are told to leave
        if self._result is not None and not self._result.done():
            if message:
                (log.error if code else log.info)("%s", message)
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
        address = self._endpoints.address(self._driver_id, self._token)
        await self._journal.publish(address, self._token, spec, self._snapshot, self._spawn)

    def _snapshot(self) -> bytes:
        return snapshot(
            self._rendezvous, self._workers.values(), self._watcher.tracker, self._tally,
            self._fleet.serial, not self._phase.forms_rounds, time.time() - self._clock(),
        )  # fmt: skip

    def _restore(self, documents: dict[str, bytes]) -> None:
        """Take the job up as the saved documents describe it (the saved settings win)."""
        saved = resumed(documents, self.settings.backend)
        if self.settings.command and self.settings.command != saved.settings.command:
            log.warning(
                "job %s runs %s (as first started); ignoring this command line's command",
                self.job_id,
                " ".join(saved.settings.command),
            )
        self._configure(saved.settings, saved.log_root)
        self._token, state = saved.token, saved.state
        self._fleet.serial = state.serial
        self._tally = Tally(state.resets, state.update_version, state.newest_commit)
        self._workers.update((w.worker_id, w) for w in saved.workers)
        self._rendezvous.restore(
            state.epoch, [(w, self._workers[w].hostname) for w in state.members]
        )
        restore_hosts(self._watcher.tracker, state, time.time() - self._clock(), self._clock())
        if state.finishing:
            self._begin_finishing()
        alive = sum(1 for w in saved.workers if w.state.alive)
        log.info(
            "resuming job %s at round %d: %d worker(s) to re-adopt", self.job_id, state.epoch,
            alive,
        )  # fmt: skip

    def _adopt(self) -> None:
        """Watch the workers an earlier driver launched, as if this one had; finish stopping
        those it was stopping when it died."""
        for worker in self._workers.values():
            stopping = worker.state is WorkerState.STOPPED and worker.exit_code is None
            if worker.state.alive or stopping:
                self._fleet.adopt(worker)
                if stopping:
                    self._stop(worker)
        self._fleet.stop_strays()

    async def _record_result(self) -> None:
        """Save how the job ended (not when this driver merely lost it)."""
        if self._phase is Phase.ABANDONED or self._result is None or not self._result.done():
            return
        await self._journal.record_result(
            self._result.result(), self._end_message, self._snapshot()
        )

    # --- launching -------------------------------------------------------------------------

    async def _launch_first_round(self, hosts: list[HostSpec]) -> None:
        """Launch the first workers on `hosts` and form round 1 with them at once."""
        max_np = self.elastic.max_np if self.elastic is not None else None
        places = first_places(hosts, self.settings.np, max_np, self.elastic is not None)
        workers = await self._staffing.place(places)
        self._rendezvous.form([(w.worker_id, w.hostname) for w in workers])
        for worker in workers:
            worker.state = WorkerState.MEMBER
        self._journal.save_soon()
        for worker in workers:
            await self._staffing.start(worker)
        (log.info if self.elastic else log.debug)(
            "round 1: %d worker(s) on %s", len(workers), host_summary(workers)
        )

    def _environment(self, worker: Worker) -> dict[str, str]:
        assert self._endpoints is not None
        return worker_environment(
            self.settings, self._endpoints, job_id=self.job_id, token=self._token,
            worker_id=worker.worker_id, hostname=worker.hostname,
            slot=self._rendezvous.slot_of(worker.worker_id),
        )  # fmt: skip

    def _scale(self) -> int:
        """Launch workers on free slots of usable hosts (`fill_slots`); return how many."""
        decision = policy.fill_slots(self._view(), self._watcher.usable())
        self._apply(decision)
        return sum(len(a.places) for a in decision.actions if isinstance(a, policy.Launch))

    def _stop(self, worker: Worker) -> None:
        """Stop `worker` for good: exclude it, SIGTERM it, SIGKILL it after --stop-grace."""
        worker.state = WorkerState.STOPPED
        self._rendezvous.exclude(worker.worker_id)
        self._journal.save_soon()
        self._fleet.stop(worker)

    # --- decisions -------------------------------------------------------------------------

    def _view(self) -> JobView:
        return JobView(
            phase=self._phase,
            elastic=self.elastic,
            workers=self._workers,
            members=self._rendezvous.members,
            waiting=self._rendezvous.waiting,
            resets=self._tally.resets,
            short_since=self._short_since if self._phase is Phase.SHORT else None,
            newest_commit=self._tally.newest_commit,
            commit_at_fleet_loss=self._commit_at_fleet_loss,
            round=self._rendezvous.epoch,
            slots=self._rendezvous.slots,
            command=self.settings.command,
            round_wanted=self._rounds.batcher.pending,
            failures_reported=self._failure_reported,
        )

    def _apply(self, decision: Decision) -> None:
        """Carry out `decision`'s actions in order; keep and (--verbose) log its reason."""
        if decision.reason:
            record = DecisionRecord(
                time=time.time(), round=self._rendezvous.epoch, reason=decision.reason
            )
            self._decisions.append(record)
            log.debug("decision: %s", decision.reason)
        for action in decision.actions:
            self._act(action, decision.reason)

    def _act(self, action: policy.Action, reason: str) -> None:
        if isinstance(action, policy.FormRound):
            self._form_round(list(action.members), reason)
        elif isinstance(action, policy.WaitForWorkers):
            self._phase, self._short_since = Phase.SHORT, action.since
        elif isinstance(action, policy.FillSlots):
            self._scale()
        elif isinstance(action, policy.Launch):
            self._spawn(self._staffing.grow(action.places, lambda: self._phase.forms_rounds))
        elif isinstance(action, policy.AskToLeave):
            self._apply(leaving.leave(self._view(), action.worker_id, action.why))
        elif isinstance(action, policy.StopWorker):
            log.info("%s is stopped: %s", self._where(action.worker_id), action.why)
            self._stop(self._workers[action.worker_id])
        elif isinstance(action, policy.HandOver):
            worker = self._workers[action.worker_id]
            worker.state, worker.handing_over = WorkerState.LEAVING, True
            worker.leave_reason = action.why
            self._journal.save_soon()
        elif isinstance(action, policy.LetGo):
            worker = self._workers[action.worker_id]
            worker.state, worker.handing_over = WorkerState.LEAVING, False
            self._rendezvous.exclude(worker.worker_id)
            self._journal.save_soon()
        elif isinstance(action, policy.Finish):
            self._finish(action.code, action.message or None)
        elif isinstance(action, policy.Log):
            getattr(log, action.level)("%s", action.line)
        elif isinstance(action, policy.ShowProgress):
            if self._clock() - self._last_progress >= PROGRESS_EVERY:
                self._last_progress = self._clock()
                log.warning("%s", action.line)
        elif isinstance(action, policy.RecordFleetLoss):
            self._commit_at_fleet_loss = action.commit
        elif isinstance(action, policy.MarkEnded):
            worker = self._workers[action.worker_id]
            worker.state = WorkerState.FAILED if action.failed else WorkerState.EXITED
            worker.handing_over = False  # ended: its state goes with it
        elif isinstance(action, policy.MarkExiting):
            self._workers[action.worker_id].exiting = True
            self._journal.save_soon()  # a restarted driver must know it said so
        elif isinstance(action, policy.Signal):
            process = self._workers[action.worker_id].process
            if action.kill:
                process.kill()
            else:
                process.terminate()
        elif isinstance(action, policy.CoolDown):
            self._watcher.host_failed(action.hostname, action.why)
        elif isinstance(action, policy.BreakRound):
            alive = [w.worker_id for w in self._fleet.alive()]
            self._rounds.break_round(action.number, action.why, alive)
        elif isinstance(action, policy.Reform):
            self._reform(action.why, action.broken)
        elif isinstance(action, policy.Arrived):
            self._rounds.arrived(action.worker_id)
        elif isinstance(action, policy.ReformIfStillWaiting):
            self._failure_reported.add(action.number)
            self._spawn(self._reform_if_still_waiting(action.number))
        elif isinstance(action, policy.AdvanceTo):
            self._rendezvous.advance_to(action.number)
        elif isinstance(action, policy.BeginFinishing):
            self._begin_finishing()
        elif isinstance(action, policy.SeeIfEnded):
            self._apply(policy.job_end(self._view()))
        elif isinstance(action, policy.SeeHandovers):
            self._apply(leaving.handovers(self._view(), self._watcher.usable()))

    def _form_wanted_round(self, reasons: list[str]) -> None:
        self._apply(policy.next_round(self._view(), policy.summarize(reasons), self._clock()))

    def _form_round(self, members: list[str], why: str) -> None:
        """Form the next round with `members`: joiners among them become members."""
        self._phase, self._short_since = Phase.RUNNING, None
        self._tally.resets += 1
        self._tally.update_version += 1
        self._rounds.form(members, self._tally.update_version, why)
        for worker_id in members:
            if self._workers[worker_id].state is WorkerState.LAUNCHING:
                self._workers[worker_id].state = WorkerState.MEMBER  # a leaving one stays so
        self._journal.save_soon()

    def _reform(self, why: str, broken: bool = False) -> None:
        """Ask for the next round; `broken`: a member died (see `RoundKeeper.want`)."""
        awaited = (lambda: policy.survivors_not_waiting(self._view())) if broken else None
        self._rounds.want(why, awaited)

    def _begin_finishing(self) -> None:
        """Training is over (a member finished): no new round, no new worker; joiners are
        stopped, members re-joining are told to leave, the others end their part and exit."""
        if not self._phase.forms_rounds:
            return
        self._phase = Phase.FINISHING
        self._rendezvous.close()
        self._journal.save_soon()
        for other in self._workers.values():
            if other.state is WorkerState.LAUNCHING:
                self._stop(other)

    # --- what workers do -------------------------------------------------------------------

    def _on_wait(self, worker_id: str, after: int, commit: int) -> None:
        """A worker whose state holds `commit` commits waits for a round after `after`."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return
        if self.elastic is None or not self._phase.forms_rounds:
            return
        self._note_commit(worker, commit)
        self._apply(on_workers.caught_up(self._view(), after))
        if worker.state is WorkerState.LAUNCHING and worker.waiting_since is None:
            worker.waiting_since = self._clock()
        self._apply(on_workers.waiting(self._view(), worker, after, self._clock()))

    async def _reform_if_still_waiting(self, number: int) -> None:
        await asyncio.sleep(self.settings.heartbeat_interval)
        if self._rendezvous.epoch == number and self._phase.forms_rounds:
            self._reform("a worker reported a failed collective", broken=True)

    def _where(self, worker_id: str) -> str:
        return self._view().where(self._workers[worker_id])

    def _note_commit(self, worker: Worker, commit: int) -> None:
        """`worker` reported that its state holds `commit` commits."""
        if commit != worker.commit:
            worker.commit = commit
            self._tally.newest_commit = max(self._tally.newest_commit, commit)
            self._apply(leaving.handovers(self._view(), self._watcher.usable()))

    @property
    def end_message(self) -> str:
        """The job's last line, once it has ended ("" for a clean end)."""
        return self._end_message

    def status(self) -> JobStatus:
        hosts = self._watcher.tracker.hosts if self.elastic is not None else self.settings.hosts
        return describe_job(
            self.job_id, self._rendezvous, self._workers.values(), hosts, self._decisions
        )


def _ended_unwatched(worker: Worker) -> bool:
    return isinstance(worker.process, AdoptedProcess) and worker.process.ended_unwatched
