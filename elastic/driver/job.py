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
from elastic.driver.control.events import ControlEvent, EpochBroken, HostsUpdated
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
from elastic.driver.policy import leaving
from elastic.driver.policy import rounds as policy
from elastic.driver.policy.liveness import Ending, Limits, Verdict, ending
from elastic.driver.policy.planning import free_slots
from elastic.driver.policy.rounds import Decision, JobView, Phase
from elastic.driver.rendezvous.batcher import RoundBatcher
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
from elastic.protocol.leave import EXIT_REASONS, FINISHED

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
        self._batcher = RoundBatcher(self._form_wanted_round)
        self._phase = Phase.RUNNING
        self._tally = Tally()
        self._short_since: float | None = None  # when the SHORT phase began
        self._broken: set[int] = set()  # rounds every live worker was told are broken
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
            self._batcher.cancel()
            await self._fleet.close(abandon=self._phase is Phase.ABANDONED)
            await endpoints.stop()

    async def _hear_reports(self) -> None:
        while True:
            self._hear(await self._reports.get())

    def _hear(self, report: Report) -> None:
        """Act on one report of the job's parts."""
        if isinstance(report, WorkerExited):
            self._on_exit(report.worker)
        elif isinstance(report, Judged):
            self._on_verdict(report.worker, report.verdict)
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
                self._catch_up(report.round)
        elif isinstance(report, LeaveAsked):
            self._on_leave(report)
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
        """Launch the first workers on `hosts` and form round 1 with them at once: -np of
        them (elastic: default every slot), at most --max-np."""
        wanted = self.settings.np if self.settings.np is not None else sum(h.slots for h in hosts)
        if self.elastic is not None and self.elastic.max_np is not None:
            wanted = min(wanted, self.elastic.max_np)
        places = free_slots(hosts, {}, wanted)
        if self.elastic is None and len(places) < wanted:
            raise UsageError(f"-np {wanted} is larger than the {len(places)} slot(s) available")
        await self._hosts.check_reachable({hostname for hostname, _ in places}, fatal=True)
        workers = [self._fleet.new_worker(hostname, slot) for hostname, slot in places]
        self._rendezvous.form([(w.worker_id, w.hostname) for w in workers])
        for worker in workers:
            worker.state = WorkerState.MEMBER
        self._journal.save_soon()
        for worker in workers:
            await self._start(worker)
        (log.info if self.elastic else log.debug)(
            "round 1: %d worker(s) on %s", len(workers), _host_summary(workers)
        )

    async def _start(self, worker: Worker) -> None:
        """Start `worker`'s process; a failure to start fails the worker (static: the job)."""
        assert self._endpoints is not None
        env = worker_environment(
            self.settings, self._endpoints, job_id=self.job_id, token=self._token,
            worker_id=worker.worker_id, hostname=worker.hostname,
            slot=self._rendezvous.slot_of(worker.worker_id),
        )  # fmt: skip
        try:
            await self._fleet.start(worker, self.settings.command, env)
        except LaunchError as err:
            if self.elastic is None or self._hosts.is_local(worker.hostname):
                raise  # the command cannot run here: trying again would not help
            worker.state = WorkerState.FAILED
            log.error("cannot start a worker on host %s: %s", worker.hostname, err)
            self._watcher.host_failed(worker.hostname, str(err))

    def _scale(self) -> int:
        """Launch workers on free slots of usable hosts (`fill_slots`); return how many."""
        decision = policy.fill_slots(self._view(), self._watcher.usable())
        self._apply(decision)
        return sum(len(a.places) for a in decision.actions if isinstance(a, policy.Launch))

    async def _grow(self, places: list[tuple[str, int]]) -> None:
        unreachable = await self._hosts.check_reachable({h for h, _ in places}, fatal=False)
        for hostname in unreachable:
            self._watcher.host_failed(hostname, "unreachable through ssh")
        started = []
        for hostname, slot in places:
            # Read again at every place: another launch may have taken it meanwhile.
            taken = {(w.hostname, w.host_slot) for w in self._workers.values() if w.state.alive}
            if hostname in unreachable or (hostname, slot) in taken:
                continue
            if not self._phase.forms_rounds:
                break
            worker = self._fleet.new_worker(hostname, slot)
            await self._start(worker)
            started.append(worker)
        if started:
            log.info("launched %d worker(s) on %s", len(started), _host_summary(started))

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
            self._spawn(self._grow(list(action.places)))
        elif isinstance(action, policy.AskToLeave):
            self._apply(leaving.leave(self._view(), action.worker_id, action.why))
        elif isinstance(action, policy.StopWorker):
            log.info("%s is stopped: %s", self._where(self._workers[action.worker_id]), action.why)
            self._stop(self._workers[action.worker_id])
        elif isinstance(action, policy.HandOver):
            self._hand_over(self._workers[action.worker_id], action.why)
        elif isinstance(action, policy.LetGo):
            self._let_go(self._workers[action.worker_id], action.why)
        elif isinstance(action, policy.Finish):
            self._finish(action.code, action.message or None)
        elif isinstance(action, policy.Warn):
            log.warning("%s", action.line)
        elif isinstance(action, policy.ShowProgress):
            if self._clock() - self._last_progress >= PROGRESS_EVERY:
                self._last_progress = self._clock()
                log.warning("%s", action.line)
        elif isinstance(action, policy.RecordFleetLoss):
            self._commit_at_fleet_loss = action.commit

    def _reform(self, why: str, broken: bool = False) -> None:
        """Ask for the next round (`RoundBatcher`); `broken`: a member died, the round waits
        for every survivor to come back to the rendezvous."""
        if not self._batcher.pending and broken:
            self._batcher.want(why, policy.survivors_not_waiting(self._view()))
        else:
            self._batcher.want(why, None)
        self._batcher.arrived(self._is_alive)

    def _is_alive(self, worker_id: str) -> bool:
        return self._workers[worker_id].state.alive

    def _form_wanted_round(self, reasons: list[str]) -> None:
        self._apply(policy.next_round(self._view(), policy.summarize(reasons), self._clock()))

    def _form_round(self, members: list[str], why: str) -> None:
        """Form the next round with `members` and tell the previous members about it."""
        previous = self._rendezvous.members
        self._phase, self._short_since = Phase.RUNNING, None
        self._tally.resets += 1
        number = self._rendezvous.form([(w, self._workers[w].hostname) for w in members])
        # Nobody can still use the keys of the round before the previous one: drop them.
        self._spawn(self._kv.delete_prefix(Rendezvous.epoch_prefix(number - 2)))
        for worker_id in members:
            if self._workers[worker_id].state is WorkerState.LAUNCHING:
                self._workers[worker_id].state = WorkerState.MEMBER  # a leaving one stays so
        self._journal.save_soon()
        before, after = set(previous), set(members)  # sets: O(N), not O(N²), per round
        self._tally.update_version += 1
        update = HostsUpdated(
            self._tally.update_version,
            number,
            tuple(self._workers[w].hostname for w in members if w not in before),
            tuple(self._workers[w].hostname for w in previous if w not in after),
        )
        self._tell(update, [w for w in previous if self._workers[w].state.alive])
        summary = _host_summary([self._workers[w] for w in members])
        log.info("round %d: %d worker(s) on %s (%s)", number, len(members), summary, why)

    def _break_round(self, number: int, why: str) -> None:
        """Tell every live worker that round `number` is broken, once per round: a worker
        blocked in one of its collectives gives up at the first word."""
        if number not in self._broken:
            self._broken.add(number)
            self._tell(EpochBroken(number, why), [w.worker_id for w in self._fleet.alive()])

    def _tell(self, event: ControlEvent, worker_ids: list[str]) -> None:
        self._channels.send(event, worker_ids)

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

    def _where(self, worker: Worker) -> str:
        slot = self._rendezvous.slot_of(worker.worker_id)
        rank = f"rank {slot.rank}" if slot is not None else f"worker {worker.worker_id}"
        return f"{rank} on host {worker.hostname}"

    def _on_exit(self, worker: Worker) -> None:
        """`worker`'s process ended (its code is `worker.exit_code`)."""
        self._channels.forget(worker.worker_id)
        kind = ending(worker, _ended_unwatched(worker))
        if kind is Ending.IGNORED:
            return
        was_member = worker.worker_id in self._rendezvous.members
        code = worker.exit_code
        if kind is Ending.FAILED:
            self._worker_failed(worker, _describe_exit(worker))
        elif kind is Ending.CANNOT_RUN:
            self._finish(
                code or 1,
                f"{self._where(worker)} could not run {self.settings.command[0]!r} (exit code "
                f"{code}: {'not found' if code == 127 else 'not executable'}); its output says "
                "more",
            )
        elif kind is Ending.LEFT:
            worker.state = WorkerState.EXITED
            if code != 0:
                log.warning("%s left with exit code %d", self._where(worker), code)
            self._scale()  # its slot is free again
        elif kind is Ending.LEFT_UNSEEN:  # its leave was not saved (etcd was down)
            worker.state = WorkerState.EXITED
            log.warning(
                "%s exited with code 0 while no driver watched it, without having said that "
                "it finished: counted as having left the job",
                self._where(worker),
            )
            if was_member and self.elastic is not None:
                self._reform(f"{self._where(worker)} left")
            if self._fleet.alive():
                self._scale()
            else:
                self._apply(policy.job_end(self._view()))
        else:
            worker.state = WorkerState.EXITED  # a member's end is training's end
            if was_member:
                self._begin_finishing()
            self._apply(policy.job_end(self._view()))

    def _on_verdict(self, worker: Worker, verdict: Verdict) -> None:
        if not worker.state.alive:
            return  # it ended since it was judged
        if verdict is Verdict.LINGERING:
            worker.process.terminate()
            return
        worker.process.kill()
        if verdict is not Verdict.NOT_JOINED:
            self._worker_failed(worker, verdict.value)
            return
        timeout = self.settings.start_timeout
        if self.elastic is None:
            missing = sorted(
                slot.rank
                for w in self._fleet.alive()
                if not w.joined and (slot := self._rendezvous.slot_of(w.worker_id)) is not None
            )
            self._finish(
                1,
                f"rank(s) {missing} did not join the rendezvous within {timeout:g} s "
                "(--start-timeout)",
            )
        else:
            self._worker_failed(worker, f"did not join within {timeout:g} s (--start-timeout)")

    def _worker_failed(self, worker: Worker, reason: str) -> None:
        """`worker` died. Static: end the job with its code. Elastic: cool its host down,
        break its round, re-form from the survivors."""
        was_member = worker.worker_id in self._rendezvous.members
        was_leaving = worker.state is WorkerState.LEAVING
        worker.state = WorkerState.FAILED
        worker.handing_over = False  # dead: its state goes with it
        where = self._where(worker)
        if self.elastic is None:
            self._finish(worker.exit_code or 1, f"{where} {reason}; stopping the other workers")
            return
        log.error("%s %s", where, reason)
        self._watcher.host_failed(worker.hostname, reason)
        if not self._phase.forms_rounds:
            self._apply(policy.job_end(self._view()))
            return
        number = self._rendezvous.epoch
        if was_member:
            self._break_round(number, f"{where} {reason}")
            self._reform(f"{where} {reason}", broken=True)
        elif was_leaving:  # peers may still be in a collective of its last round with it
            self._break_round(number - 1, f"{where} {reason}")
        if not self._fleet.alive():
            self._apply(policy.fleet_lost(self._view(), worker.exit_code, self._clock()))
        else:
            self._scale()  # refill the slot at once if its host is not in cooldown
            self._apply(leaving.handovers(self._view(), self._watcher.usable()))

    def _on_wait(self, worker_id: str, after: int, commit: int) -> None:
        """A worker whose state holds `commit` commits waits for a round after `after`."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return
        if self.elastic is None or not self._phase.forms_rounds:
            return
        self._note_commit(worker, commit)
        self._catch_up(after)
        if worker.state is WorkerState.LAUNCHING:
            if worker.waiting_since is None:
                worker.waiting_since = self._clock()
            self._apply(policy.joiner_waiting(self._view(), self._clock()))
        elif worker.state is WorkerState.MEMBER and after >= self._rendezvous.epoch:
            if self._batcher.pending:
                self._batcher.arrived(self._is_alive, worker_id)
            elif after not in self._failure_reported:
                # It saw its round fail before the driver saw a death: re-form after one
                # heartbeat interval unless the death shows up first and re-forms itself.
                self._failure_reported.add(after)
                self._spawn(self._reform_if_still_waiting(after))

    async def _reform_if_still_waiting(self, number: int) -> None:
        await asyncio.sleep(self.settings.heartbeat_interval)
        if self._rendezvous.epoch == number and self._phase.forms_rounds:
            self._reform("a worker reported a failed collective", broken=True)

    def _catch_up(self, number: int) -> None:
        """A worker is in round `number`, newer than any this driver knows: an earlier driver
        formed it and died before saving it (etcd was down). Break it and form a newer one
        from the workers this driver knows; those it does not know are refused when they
        call, and exit."""
        if number <= self._rendezvous.epoch or self.elastic is None:
            return
        if not self._phase.forms_rounds:
            return
        log.warning(
            "a worker is in round %d, which the previous driver formed but never saved (this "
            "driver resumed at round %d): re-forming",
            number,
            self._rendezvous.epoch,
        )
        self._rendezvous.advance_to(number)
        self._break_round(number, "the driver restarted")
        self._reform(f"round {number} was never saved", broken=True)

    def _note_commit(self, worker: Worker, commit: int) -> None:
        """`worker` reported that its state holds `commit` commits."""
        if commit != worker.commit:
            worker.commit = commit
            self._tally.newest_commit = max(self._tally.newest_commit, commit)
            self._apply(leaving.handovers(self._view(), self._watcher.usable()))

    def _on_leave(self, report: LeaveAsked) -> None:
        worker = self._workers[report.worker_id]
        if not worker.state.alive:
            return
        # Before judging whether it holds the only copy of the state: a driver that has just
        # restarted may not have had a heartbeat from it yet.
        self._note_commit(worker, report.commit)
        if report.reason not in EXIT_REASONS:
            self._apply(leaving.leave(self._view(), worker.worker_id, report.reason))
            return
        worker.exiting = True  # judged by its exit code from now on, not by heartbeats
        self._journal.save_soon()  # a restarted driver must know it said so
        # A member's script returned: training is over. That includes a leaver still handing
        # its state over (a member until then); one that already left is none.
        if report.reason == FINISHED and worker.worker_id in self._rendezvous.members:
            self._begin_finishing()

    def _hand_over(self, worker: Worker, why: str) -> None:
        worker.state, worker.handing_over, worker.leave_reason = WorkerState.LEAVING, True, why
        self._journal.save_soon()
        log.info(
            "%s leaves the job (%s) once another worker holds its state (commit %d)",
            self._where(worker),
            why,
            worker.commit,
        )
        self._apply(leaving.handovers(self._view(), self._watcher.usable()))

    def _let_go(self, worker: Worker, why: str) -> None:
        """Exclude the leaving `worker` from the job and re-form without it."""
        worker.state, worker.handing_over = WorkerState.LEAVING, False
        self._rendezvous.exclude(worker.worker_id)
        log.info("%s leaves the job: %s", self._where(worker), why)
        if self.elastic is not None:
            self._reform(f"{self._where(worker)} leaves: {why}")
        else:
            self._journal.save_soon()

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


def _describe_exit(worker: Worker) -> str:
    if worker.process.signal is not None:
        name = signal.Signals(worker.process.signal).name
        return f"was killed by signal {name} (exit code {worker.exit_code})"
    return f"exited with code {worker.exit_code}"


def _host_summary(workers: list[Worker]) -> str:
    counts: dict[str, int] = {}
    for worker in workers:
        counts[worker.hostname] = counts.get(worker.hostname, 0) + 1
    return ", ".join(f"{host}:{count}" for host, count in counts.items())
