"""Between a job's start and its end: hear its parts' reports, ask the policy, act.

The conductor owns the job's phase and counters and is the only code that carries out the
policy's decisions (`policy/`): it builds the read-only view a policy function decides from,
asks the function each report calls for, and applies the decision's actions in order.

Both directions go through a table by type: `_hearers` (a report's type -> the method that
hears it) and `_doers` (an action's type -> the method that carries it out), so a new report
or action is one entry and one small method.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, get_args

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import RoundBroken
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.journal.resume import Tally
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.staffing import Staffing
from elastic.driver.logs import tags
from elastic.driver.observe.stall_watch import StallWatch
from elastic.driver.observe.timeline import RoundTimeline
from elastic.driver.policy import (
    actions,
    end_causes,
    forming,
    host_changes,
    leaving,
    reachability,
    worker_events,
)
from elastic.driver.policy.actions import Decision
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.view import FleetLoss, JobView
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.rendezvous.round_keeper import RoundKeeper
from elastic.driver.reports import (
    DrainAsked,
    DurableStale,
    Heard,
    HostNoticed,
    HostsChanged,
    Joined,
    Judged,
    KeysLost,
    LeaveAsked,
    PeersUnreachable,
    Report,
    StopAsked,
    Tick,
    Waiting,
    WorkerExited,
)
from elastic.driver.settings import Settings
from elastic.driver.worker_history import WorkerHistory
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import DecisionRecord

log = logging.getLogger("elasticrun")

DECISIONS_KEPT = 50  # the newest decisions `/v1/status` shows
PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines
# Heartbeat intervals (and at least `UNREACHABLE_SETTLE_FLOOR` s) between a round's first
# unreachability report and the decision: its members probe at about the same time (blocked
# in the same collective), but a probe over a slow link takes longer; a decision on the
# first report alone could cut off the wrong host.
UNREACHABLE_SETTLE = 2
UNREACHABLE_SETTLE_FLOOR = 1.5

Spawn = Callable[[Coroutine[Any, Any, Any]], None]
Handler = Callable[[Any], None]  # one report's or one action's, by its type


class Conductor:
    """Carries a job from its first round to its end, one report at a time (`hear`).

    `phase` says where the job is (`Phase`); `tally` counts its rounds and commits;
    `history` bounds the ended workers' records (after each exit and each round formed) and
    counts them; `decisions` keeps the newest decisions with their reasons; `timeline` the
    rounds with their causes and recovery times; `stalls` watches for the current round's
    stall. It acts through the parts it is given: `fleet` (processes), `staffing` (new
    workers), `rendezvous` (through its `RoundKeeper`, `rounds`), `watcher` (hosts),
    `save_soon` (the journal), `spawn` (a task of the job) and `finish(code, message)`,
    which ends the job.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        fleet: Fleet,
        staffing: Staffing,
        rendezvous: Rendezvous,
        channels: ControlChannels,
        kv: MemoryKeyValueStore,
        watcher: HostWatcher,
        save_soon: Callable[[], None],
        spawn: Spawn,
        finish: Callable[[int, str | None], None],
        clock: Callable[[], float],
        timeline: RoundTimeline | None = None,
    ) -> None:
        self._settings, self._elastic = settings, settings.elastic
        self._fleet, self._workers, self._staffing = fleet, fleet.workers, staffing
        self._rendezvous, self._channels, self._watcher = rendezvous, channels, watcher
        self._save_soon, self._spawn, self._finish, self._clock = save_soon, spawn, finish, clock
        self.rounds = RoundKeeper(
            rendezvous, channels, kv, self._workers, self._form_wanted_round, spawn,
            alive=lambda: [w.worker_id for w in fleet.alive()],
        )  # fmt: skip
        self.phase = Phase.RUNNING
        self.tally = Tally()
        self.history = WorkerHistory(self._workers, settings.worker_history)
        self.decisions: deque[DecisionRecord] = deque(maxlen=DECISIONS_KEPT)
        self.timeline = timeline or RoundTimeline(clock)
        self.stalls = StallWatch(settings.stall_warning)
        self._wanted_causes: list[Cause] = []  # of the round wanted next, in order
        self._short_since: float | None = None  # when the SHORT phase began
        self._failure_reported: set[int] = set()  # rounds a member said failed, unseen here
        self._fleet_loss: FleetLoss | None = None  # how every worker was last lost
        self._last_progress = 0.0
        self._leavers: set[str] = set()  # workers that were handing their state over
        # The current round's unreachability reports, by reporter (see `_on_unreachable`).
        self._unreachable: tuple[int, dict[str, set[int]]] = (0, {})
        self._keys_lost: set[int] = set()  # rounds re-formed for keys an earlier driver held
        self._hearers: dict[type[Any], Handler] = {
            WorkerExited: self._on_exited,
            Judged: self._on_judged,
            Tick: self._on_tick,
            Waiting: self._on_wait,
            Joined: self._on_joined,
            Heard: self._on_heard,
            LeaveAsked: self._on_leave_asked,
            PeersUnreachable: self._on_unreachable,
            KeysLost: self._on_keys_lost,
            DurableStale: self._on_durable,
            DrainAsked: self._on_drain,
            StopAsked: self._on_stop,
            HostNoticed: self._on_noticed,
            HostsChanged: self._on_hosts_changed,
        }
        self._doers: dict[type[Any], Handler] = {
            actions.FormRound: self._form_round,
            actions.WaitForWorkers: self._wait_for_workers,
            actions.FillSlots: lambda _: self._scale(),
            actions.Launch: self._launch,
            actions.AskToLeave: self._ask_to_leave,
            actions.StopWorker: self._stop_worker,
            actions.HandOver: self._hand_over,
            actions.LetGo: self._let_go,
            actions.Finish: lambda action: self._finish(action.code, action.message or None),
            actions.Log: self._log,
            actions.ShowProgress: self._show_progress,
            actions.RecordFleetLoss: self._record_fleet_loss,
            actions.MarkEnded: self._mark_ended,
            actions.MarkExiting: self._mark_exiting,
            actions.TakeOut: self._take_out,
            actions.Signal: self._signal,
            actions.CoolDown: lambda action: self._watcher.host_failed(action.hostname, action.why),
            actions.BreakRound: lambda action: self.rounds.break_round(action.number, action.why),
            actions.Reform: self._reform_for,
            actions.Arrived: lambda action: self.rounds.arrived(action.worker_id),
            actions.ReformIfStillWaiting: self._reform_later,
            actions.AdvanceTo: lambda action: self._rendezvous.advance_to(action.number),
            actions.BeginFinishing: lambda _: self.begin_finishing(),
            actions.SeeIfEnded: lambda _: self.apply(forming.job_end(self.view())),
            actions.SeeHandovers: lambda _: self._see_handovers(),
            actions.Drain: self._drain,
        }
        assert set(self._hearers) == set(get_args(Report)), "a report without a hearer"
        assert set(self._doers) == set(get_args(actions.Action)), "an action without a doer"

    def resume(self, tally: Tally, finishing: bool) -> None:
        """Take up the counters and phase an earlier driver saved, its workers restored."""
        self.tally = tally
        self._leavers = {w.worker_id for w in self._workers.values() if w.handing_over}
        if finishing:
            self.begin_finishing()

    def hear(self, report: Report) -> None:
        """Act on one report of the job's parts (its hearer in `_hearers`)."""
        self._hearers[type(report)](report)

    def view(self) -> JobView:
        return JobView(
            phase=self.phase,
            elastic=self._elastic,
            workers=self._workers,
            members=self._rendezvous.members,
            waiting=self._rendezvous.waiting,
            resets=self.tally.resets,
            short_since=self._short_since if self.phase is Phase.SHORT else None,
            newest_commit=self.tally.newest_commit,
            fleet_loss=self._fleet_loss,
            round=self._rendezvous.round,
            slots=self._rendezvous.slots,
            command=self._settings.command,
            round_wanted=self.rounds.batcher.pending,
            failures_reported=self._failure_reported,
            checkpoint_dir=self._settings.checkpoint.directory,
        )

    def apply(self, decision: Decision) -> None:
        """Carry out `decision`'s actions in order (each by its doer in `_doers`); keep and
        (--verbose) log its reason."""
        if decision.reason:
            record = DecisionRecord(
                time=time.time(), round=self._rendezvous.round, reason=decision.reason
            )
            self.decisions.append(record)
            log.debug("decision: %s", decision.reason)
        for action in decision.actions:
            self._doers[type(action)](action)

    def stop(self, worker: Worker) -> None:
        """Stop `worker` for good: exclude it, SIGTERM it, SIGKILL it after --stop-grace."""
        worker.state = WorkerState.STOPPED
        worker.end_cause = worker.end_cause or end_causes.STOPPED
        self._rendezvous.exclude(worker.worker_id)
        self._save_soon()
        self._fleet.stop(worker)

    def begin_finishing(self) -> None:
        """Training is over (a member finished): no new round, no new worker; joiners are
        stopped, members re-joining are told to leave, the others end their part and exit."""
        if not self.phase.forms_rounds:
            return
        self.phase = Phase.FINISHING
        self._rendezvous.close()
        self._save_soon()
        for other in self._workers.values():
            if other.state is WorkerState.LAUNCHING:
                self.stop(other)

    # --- hearing reports -------------------------------------------------------------------

    def _on_exited(self, report: WorkerExited) -> None:
        self._channels.forget(report.worker.worker_id)
        process = report.worker.process
        unwatched = process is not None and process.ended_unwatched
        self.apply(worker_events.exited(self.view(), report.worker, unwatched, self._clock()))
        self._retire()

    def _on_judged(self, report: Judged) -> None:
        timeout, now = self._settings.start_timeout, self._clock()
        self.apply(worker_events.judged(self.view(), report.worker, report.verdict, timeout, now))

    def _on_tick(self, report: Tick) -> None:
        self.apply(forming.tick(self.view(), report.now))
        if self._fleet.standbys is not None and self.phase.forms_rounds:
            self._keep_standbys(report.now)
        if stall := self.stalls.look(self._rendezvous, self._workers, report.now):
            timeout = self._settings.stall_timeout
            self.apply(worker_events.stall_seen(self.view(), stall, timeout, report.now))

    def _on_wait(self, report: Waiting) -> None:
        """A worker whose state holds `commit` commits waits for a round after `after`."""
        worker = self._workers.get(report.worker_id)
        if worker is None or not worker.state.alive:
            return
        if self._elastic is None or not self.phase.forms_rounds:
            return
        self._note_commit(worker, report.commit)
        self.apply(worker_events.caught_up(self.view(), report.after))
        if worker.state is WorkerState.LAUNCHING and worker.waiting_since is None:
            worker.waiting_since = self._clock()
        self.apply(worker_events.waiting(self.view(), worker, report.after, self._clock()))

    def _on_joined(self, report: Joined) -> None:
        if (worker := self._workers.get(report.worker_id)) is not None:
            worker.joined = True

    # A report about a worker was made while it lived; its record may be gone since (it
    # ended, and `history` dropped it), hence `.get` below.

    def _on_heard(self, report: Heard) -> None:
        worker = self._workers.get(report.worker_id)
        if worker is not None and worker.state.alive:
            self._note_commit(worker, report.commit)
            self.apply(worker_events.caught_up(self.view(), report.round))

    def _on_leave_asked(self, report: LeaveAsked) -> None:
        worker = self._workers.get(report.worker_id)
        if worker is not None and worker.state.alive:  # its commit first: a restarted
            self._note_commit(worker, report.commit)  # driver may not know it yet
            self.apply(leaving.asked(self.view(), worker, report.reason))

    def _on_unreachable(self, report: PeersUnreachable) -> None:
        """Gather round `report.round`'s reports; the first one starts the wait for the others
        (`UNREACHABLE_SETTLE` heartbeat intervals, `UNREACHABLE_SETTLE_FLOOR` s at least),
        after which `reachability.cut_off` decides from all of them."""
        number, reports = self._unreachable
        if report.round != self._rendezvous.round or not self.phase.forms_rounds:
            return
        if number != report.round:
            number, reports = self._unreachable = (report.round, {})
            self._spawn(self._cut_off_after_settling(number))
        reports.setdefault(report.worker_id, set()).update(report.ranks)

    def _on_keys_lost(self, report: KeysLost) -> None:
        if report.round not in self._keys_lost:
            self._keys_lost.add(report.round)
            self.apply(worker_events.keys_lost(self.view(), report.round))

    def _on_durable(self, report: DurableStale) -> None:
        worker = self._workers.get(report.worker_id)
        if worker is None:
            return
        self.apply(worker_events.durable_stale(worker, report.stale, report.written))

    def _on_drain(self, report: DrainAsked) -> None:
        tracker, hostname = self._watcher.tracker, report.hostname
        was_drained = hostname in tracker.drained
        cooling = tracker.cooldown.in_cooldown(hostname, self._clock())
        decision = host_changes.drain_asked(
            self.view(), hostname, report.drained, was_drained, cooling
        )
        self.apply(decision)

    def _on_stop(self, report: StopAsked) -> None:
        self._finish(0, "stopped by `elasticrun stop`: stopping every worker")

    def _on_noticed(self, report: HostNoticed) -> None:
        self._watcher.host_noticed(report.hostname, report.leaving_at)

    def _on_hosts_changed(self, report: HostsChanged) -> None:
        tracker = self._watcher.tracker
        offered = {h.hostname for h in tracker.discovered_hosts}
        noticed = tracker.leaving(self._clock())  # offered, but about to be taken away
        drained = tracker.drained
        self.apply(
            host_changes.hosts_changed(self.view(), report.change, offered, noticed, drained)
        )

    # --- carrying out actions --------------------------------------------------------------

    def _form_round(self, action: actions.FormRound) -> None:
        """Form the next round with the action's members, for its cause unless a round was
        wanted for another first: joiners among them become members."""
        members = list(action.members)
        self.phase, self._short_since = Phase.RUNNING, None
        self.tally.resets += 1
        self.tally.update_version += 1
        number = self.rounds.form(members, self.tally.update_version, action.why)
        cause = self._wanted_causes[0] if self._wanted_causes else action.cause
        self._wanted_causes.clear()
        self.timeline.formed(number, len(members), cause, action.why)
        for worker_id in members:
            if self._workers[worker_id].state is WorkerState.LAUNCHING:
                self._workers[worker_id].state = WorkerState.MEMBER  # a leaving one stays so
        # Only the current round's failures and lost keys are ever looked up again.
        self._failure_reported = {n for n in self._failure_reported if n >= number}
        self._keys_lost = {n for n in self._keys_lost if n >= number}
        self._retire()  # the previous round's dead members are no members any more
        self._save_soon()

    def _wait_for_workers(self, action: actions.WaitForWorkers) -> None:
        self.phase, self._short_since = Phase.SHORT, action.since

    def _launch(self, action: actions.Launch) -> None:
        self._spawn(self._staffing.grow(action.places, lambda: self.phase.forms_rounds))

    def _ask_to_leave(self, ask: actions.AskToLeave) -> None:
        self.apply(leaving.leave(self.view(), ask.worker_id, ask.why, ask.cause, ask.along))

    def _stop_worker(self, action: actions.StopWorker) -> None:
        log.info("%s is stopped: %s", self._where(action.worker_id), action.why)
        self.stop(self._workers[action.worker_id])

    def _hand_over(self, action: actions.HandOver) -> None:
        worker = self._workers[action.worker_id]
        worker.state, worker.handing_over = WorkerState.LEAVING, True
        worker.leave_reason, worker.leave_cause = action.why, action.cause
        self._leavers.add(worker.worker_id)
        self._save_soon()

    def _let_go(self, action: actions.LetGo) -> None:
        worker = self._workers[action.worker_id]
        worker.state, worker.handing_over = WorkerState.LEAVING, False
        self._rendezvous.exclude(worker.worker_id)
        self._save_soon()

    def _log(self, line: actions.Log) -> None:
        getattr(log, line.level)("%s", line.line, extra=self._tags(line))

    def _show_progress(self, action: actions.ShowProgress) -> None:
        if self._clock() - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = self._clock()
            log.warning("%s", action.line)

    def _record_fleet_loss(self, action: actions.RecordFleetLoss) -> None:
        self._fleet_loss = action.loss

    def _mark_ended(self, action: actions.MarkEnded) -> None:
        worker = self._workers[action.worker_id]
        worker.state = WorkerState.FAILED if action.failed else WorkerState.EXITED
        worker.end_cause = action.cause or worker.end_cause
        worker.handing_over = False  # ended: its state goes with it

    def _mark_exiting(self, action: actions.MarkExiting) -> None:
        self._workers[action.worker_id].exiting = True
        self._save_soon()  # a restarted driver must know it said so

    def _take_out(self, action: actions.TakeOut) -> None:
        worker = self._workers[action.worker_id]
        if worker.state.alive:  # told first: a collective it is blocked in fails now
            word = RoundBroken(action.number, action.why, rejoin=True)
            self._channels.send(word, [worker.worker_id])
            self.stop(worker)

    def _signal(self, action: actions.Signal) -> None:
        process = self._workers[action.worker_id].process
        if action.kill:
            process.kill()
        else:
            process.terminate()

    def _reform_for(self, action: actions.Reform) -> None:
        if action.cause is Cause.FAILURE:
            self.timeline.noticed()
        self._wanted_causes.append(action.cause)
        self._reform(action.why, action.broken)

    def _reform_later(self, action: actions.ReformIfStillWaiting) -> None:
        self._failure_reported.add(action.number)
        self._spawn(self._reform_if_still_waiting(action.number))

    def _drain(self, action: actions.Drain) -> None:
        self._watcher.drain(action.hostname, action.drained)
        self._save_soon()  # a restarted driver keeps the host drained

    # --- the rest ----------------------------------------------------------------------------

    def _scale(self) -> int:
        """Launch workers on free slots of usable hosts (`fill_slots`); return how many."""
        decision = forming.fill_slots(self.view(), self._watcher.usable())
        self.apply(decision)
        return sum(len(a.places) for a in decision.actions if isinstance(a, actions.Launch))

    def _keep_standbys(self, now: float) -> None:
        """Standbys on the usable hosts whose workers joined a round (they start after the
        workers' own imports); none on a host gone from discovery, drained or noticed."""
        assert self._fleet.standbys is not None
        tracker = self._watcher.tracker
        offered = {spec.hostname for spec in tracker.discovered_hosts}
        allowed = offered - tracker.drained - set(tracker.leaving(now))
        usable = {spec.hostname for spec in tracker.hosts}  # not cooling down either
        joined = {w.hostname for w in self._workers.values() if w.joined and w.state.alive}
        self._fleet.standbys.keep(joined & usable & allowed, allowed)

    def _form_wanted_round(self, reasons: list[str]) -> None:
        cause = self._wanted_causes[0] if self._wanted_causes else Cause.JOIN
        why = forming.summarize(reasons)
        self.apply(forming.next_round(self.view(), why, self._clock(), cause))

    def _reform(self, why: str, broken: bool = False) -> None:
        """Ask for the next round; `broken`: a member died (see `RoundKeeper.want`)."""
        awaited = (lambda: forming.survivors_not_waiting(self.view())) if broken else None
        self.rounds.want(why, awaited)

    async def _cut_off_after_settling(self, number: int) -> None:
        interval = self._settings.heartbeat_interval
        await asyncio.sleep(max(UNREACHABLE_SETTLE * interval, UNREACHABLE_SETTLE_FLOOR))
        reports = self._unreachable[1] if self._unreachable[0] == number else {}
        self.apply(reachability.cut_off(self.view(), number, reports, self._clock()))

    async def _reform_if_still_waiting(self, number: int) -> None:
        await asyncio.sleep(self._settings.heartbeat_interval)
        if self._rendezvous.round == number and self.phase.forms_rounds:
            self._reform("a worker reported a failed collective", broken=True)

    def _tags(self, line: actions.Log) -> dict[str, Any]:
        """The `extra=` of a policy's `line`: its event, and the rank and host of its worker."""
        worker = self._workers.get(line.worker_id)
        slot = self._rendezvous.slot_of(line.worker_id) if worker is not None else None
        host = worker.hostname if worker is not None else None
        return tags(line.event, rank=slot.rank if slot is not None else None, host=host)

    def _retire(self) -> None:
        """Drop the records of ended workers past --worker-history (`history.retire`), and
        what the driver kept for them."""
        for worker in self.history.retire(self._rendezvous.slots):
            self._channels.forget(worker.worker_id)
            self._rendezvous.forget(worker.worker_id)
            self._leavers.discard(worker.worker_id)

    def _where(self, worker_id: str) -> str:
        return self.view().where(self._workers[worker_id])

    def _note_commit(self, worker: Worker, commit: int) -> None:
        """`worker` reported that its state holds `commit` commits."""
        if commit != worker.commit:
            worker.commit = commit
            self.tally.newest_commit = max(self.tally.newest_commit, commit)
            self._see_handovers()

    def _see_handovers(self) -> None:
        """Let go the leavers whose state is held elsewhere now (`leaving.handovers`); costs
        nothing while nobody hands its state over, as at every commit of a large job."""
        workers = self._workers
        self._leavers = {w for w in self._leavers if (o := workers.get(w)) and o.handing_over}
        if self._leavers:
            self.apply(leaving.handovers(self.view(), self._watcher.usable()))
