"""Between a job's start and its end: hear its parts' reports, ask the policy, act.

The conductor owns the job's phase and counters and is the only code that carries out the
policy's decisions (`policy/`): it builds the read-only view a policy function decides from,
asks the function each report calls for, and applies the decision's actions in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import EpochBroken
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.journal.resume import Tally
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.staffing import Staffing
from elastic.driver.logs import tags
from elastic.driver.observe.stalls import RankActivity, find_stall
from elastic.driver.observe.timeline import RoundTimeline
from elastic.driver.policy import actions, forming, host_changes, leaving, reachability
from elastic.driver.policy import worker_events as on_workers
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
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import DecisionRecord, StallReport

log = logging.getLogger("elasticrun")

DECISIONS_KEPT = 50  # the newest decisions `/v1/status` shows
PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines
STALL_LOOK_EVERY = 1.0  # seconds between two looks for a stall
# Heartbeat intervals (and at least `UNREACHABLE_SETTLE_FLOOR` s) between a round's first
# unreachability report and the decision: its members probe at about the same time (blocked
# in the same collective), but a probe over a slow link takes longer; a decision on the
# first report alone could cut off the wrong host.
UNREACHABLE_SETTLE = 2
UNREACHABLE_SETTLE_FLOOR = 1.5

Spawn = Callable[[Coroutine[Any, Any, Any]], None]


class Conductor:
    """Carries a job from its first round to its end, one report at a time (`hear`).

    `phase` says where the job is (`Phase`); `tally` counts its rounds and commits;
    `decisions` keeps the newest decisions with their reasons; `timeline` the rounds with
    their causes and recovery times; `stall` the current round's stall (`find_stall`), if
    any. It acts through the parts it is given: `fleet` (processes), `staffing` (new
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
        self.decisions: deque[DecisionRecord] = deque(maxlen=DECISIONS_KEPT)
        self.timeline = timeline or RoundTimeline(clock)
        self.stall: StallReport | None = None
        self._stall_looked = float("-inf")  # when `_look_for_stall` last looked
        self._wanted_causes: list[Cause] = []  # of the round wanted next, in order
        self._short_since: float | None = None  # when the SHORT phase began
        self._failure_reported: set[int] = set()  # rounds a member said failed, unseen here
        self._fleet_loss: FleetLoss | None = None  # how every worker was last lost
        self._last_progress = 0.0
        self._leavers: set[str] = set()  # workers that were handing their state over
        # The current round's unreachability reports, by reporter (see `_on_unreachable`).
        self._unreachable: tuple[int, dict[str, set[int]]] = (0, {})
        self._keys_lost: set[int] = set()  # rounds re-formed for keys an earlier driver held

    def resume(self, tally: Tally, finishing: bool) -> None:
        """Take up the counters and phase an earlier driver saved, its workers restored."""
        self.tally = tally
        self._leavers = {w.worker_id for w in self._workers.values() if w.handing_over}
        if finishing:
            self.begin_finishing()

    def hear(self, report: Report) -> None:
        """Act on one report of the job's parts."""
        now = self._clock()
        if isinstance(report, WorkerExited):
            self._channels.forget(report.worker.worker_id)
            ended_unwatched = _ended_unwatched(report.worker)
            self.apply(on_workers.exited(self.view(), report.worker, ended_unwatched, now))
        elif isinstance(report, Judged):
            timeout = self._settings.start_timeout
            verdict = report.verdict
            self.apply(on_workers.judged(self.view(), report.worker, verdict, timeout, now))
        elif isinstance(report, Tick):
            self.apply(forming.tick(self.view(), report.now))
            self._look_for_stall(report.now)
        elif isinstance(report, Waiting):
            self._on_wait(report.worker_id, report.after, report.commit)
        elif isinstance(report, Joined):
            if (worker := self._workers.get(report.worker_id)) is not None:
                worker.joined = True
        elif isinstance(report, Heard):
            if self._workers[report.worker_id].state.alive:
                self._note_commit(self._workers[report.worker_id], report.commit)
                self.apply(on_workers.caught_up(self.view(), report.round))
        elif isinstance(report, LeaveAsked):
            worker = self._workers[report.worker_id]
            if worker.state.alive:  # its commit first: a restarted driver may not know it yet
                self._note_commit(worker, report.commit)
                self.apply(leaving.asked(self.view(), worker, report.reason))
        elif isinstance(report, PeersUnreachable):
            self._on_unreachable(report)
        elif isinstance(report, KeysLost):
            if report.round not in self._keys_lost:
                self._keys_lost.add(report.round)
                self.apply(on_workers.keys_lost(self.view(), report.round))
        elif isinstance(report, DurableStale):
            self._on_durable(report)
        elif isinstance(report, DrainAsked):
            self._on_drain(report.hostname, report.drained)
        elif isinstance(report, StopAsked):
            self._finish(0, "stopped by `elasticrun stop`: stopping every worker")
        elif isinstance(report, HostNoticed):
            self._watcher.host_noticed(report.hostname, report.leaving_at)
        elif isinstance(report, HostsChanged):
            tracker = self._watcher.tracker
            noticed = tracker.leaving(self._clock())  # offered, but about to be taken away
            gone = noticed.keys() | tracker.drained
            discovered = {h.hostname for h in tracker.discovered_hosts} - gone
            removed = report.change.removed
            decision = host_changes.hosts_removed(
                self.view(), removed, discovered, noticed, tracker.drained
            )
            self.apply(decision)
            resized = {h.hostname: h.slots for h in report.change.hosts}
            slots = {name: resized[name] for name in report.change.resized}
            self.apply(host_changes.hosts_resized(self.view(), slots))
            if report.change.added:
                log.info("hosts available: %s", ", ".join(report.change.added),
                         extra={"event": "join"})  # fmt: skip
            self._scale()

    def _on_drain(self, hostname: str, drained: bool) -> None:
        if drained == (hostname in self._watcher.tracker.drained):
            return
        if drained:
            log.warning(
                "host %s is drained (elasticrun drain): its workers leave at their next step, "
                "and it gets no new ones until `elasticrun undrain %s`",
                hostname,
                hostname,
                extra={"event": "leave"},
            )
        else:
            log.info("host %s is undrained: its free slots are filled again", hostname)
        cooling = self._watcher.tracker.cooldown.in_cooldown(hostname, self._clock())
        self._watcher.drain(hostname, drained)
        self._save_soon()  # a restarted driver keeps the host drained
        if drained and cooling:
            # No usable host changes (it was not usable), so no `HostsChanged` comes; but a
            # host in cooldown keeps its surviving workers, which must leave now.
            only = frozenset({hostname})
            self.apply(host_changes.hosts_removed(self.view(), [hostname], set(), {}, only))

    def _on_durable(self, report: DurableStale) -> None:
        """Say, once per change, that the durable copy lags or is written again."""
        worker = self._workers[report.worker_id]
        newest = report.written or "none"
        if report.stale:
            log.warning(
                "the durable copy is stale: worker %s on %s failed to write a durable commit "
                "(newest written: %s; its log says why); training goes on",
                worker.worker_id,
                worker.hostname,
                newest,
            )
        else:
            log.info("durable commits are written again (newest: %s)", newest)

    def _scale(self) -> int:
        """Launch workers on free slots of usable hosts (`fill_slots`); return how many."""
        decision = forming.fill_slots(self.view(), self._watcher.usable())
        self.apply(decision)
        return sum(len(a.places) for a in decision.actions if isinstance(a, actions.Launch))

    def stop(self, worker: Worker) -> None:
        """Stop `worker` for good: exclude it, SIGTERM it, SIGKILL it after --stop-grace."""
        worker.state = WorkerState.STOPPED
        self._rendezvous.exclude(worker.worker_id)
        self._save_soon()
        self._fleet.stop(worker)

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
            round=self._rendezvous.epoch,
            slots=self._rendezvous.slots,
            command=self._settings.command,
            round_wanted=self.rounds.batcher.pending,
            failures_reported=self._failure_reported,
            checkpoint_dir=self._settings.checkpoint.directory,
        )

    def apply(self, decision: Decision) -> None:
        """Carry out `decision`'s actions in order; keep and (--verbose) log its reason."""
        if decision.reason:
            record = DecisionRecord(
                time=time.time(), round=self._rendezvous.epoch, reason=decision.reason
            )
            self.decisions.append(record)
            log.debug("decision: %s", decision.reason)
        for action in decision.actions:
            self._act(action, decision.reason)

    def _act(self, action: actions.Action, reason: str) -> None:
        if isinstance(action, actions.FormRound):
            self._form_round(list(action.members), reason, action.cause)
        elif isinstance(action, actions.WaitForWorkers):
            self.phase, self._short_since = Phase.SHORT, action.since
        elif isinstance(action, actions.FillSlots):
            self._scale()
        elif isinstance(action, actions.Launch):
            self._spawn(self._staffing.grow(action.places, lambda: self.phase.forms_rounds))
        elif isinstance(action, actions.AskToLeave):
            ask = action
            self.apply(leaving.leave(self.view(), ask.worker_id, ask.why, ask.cause, ask.along))
        elif isinstance(action, actions.StopWorker):
            log.info("%s is stopped: %s", self._where(action.worker_id), action.why)
            self.stop(self._workers[action.worker_id])
        elif isinstance(action, actions.HandOver):
            worker = self._workers[action.worker_id]
            worker.state, worker.handing_over = WorkerState.LEAVING, True
            worker.leave_reason, worker.leave_cause = action.why, action.cause
            self._leavers.add(worker.worker_id)
            self._save_soon()
        elif isinstance(action, actions.LetGo):
            worker = self._workers[action.worker_id]
            worker.state, worker.handing_over = WorkerState.LEAVING, False
            self._rendezvous.exclude(worker.worker_id)
            self._save_soon()
        elif isinstance(action, actions.Finish):
            self._finish(action.code, action.message or None)
        elif isinstance(action, actions.Log):
            getattr(log, action.level)("%s", action.line, extra=self._tags(action))
        elif isinstance(action, actions.ShowProgress):
            if self._clock() - self._last_progress >= PROGRESS_EVERY:
                self._last_progress = self._clock()
                log.warning("%s", action.line)
        elif isinstance(action, actions.RecordFleetLoss):
            self._fleet_loss = action.loss
        elif isinstance(action, actions.MarkEnded):
            worker = self._workers[action.worker_id]
            worker.state = WorkerState.FAILED if action.failed else WorkerState.EXITED
            worker.handing_over = False  # ended: its state goes with it
        elif isinstance(action, actions.MarkExiting):
            self._workers[action.worker_id].exiting = True
            self._save_soon()  # a restarted driver must know it said so
        elif isinstance(action, actions.TakeOut):
            worker = self._workers[action.worker_id]
            if worker.state.alive:  # told first: a collective it is blocked in fails now
                word = EpochBroken(action.number, action.why, rejoin=True)
                self._channels.send(word, [worker.worker_id])
                self.stop(worker)
        elif isinstance(action, actions.Signal):
            process = self._workers[action.worker_id].process
            if action.kill:
                process.kill()
            else:
                process.terminate()
        elif isinstance(action, actions.CoolDown):
            self._watcher.host_failed(action.hostname, action.why)
        elif isinstance(action, actions.BreakRound):
            self.rounds.break_round(action.number, action.why)
        elif isinstance(action, actions.Reform):
            if action.cause is Cause.FAILURE:
                self.timeline.noticed()
            self._wanted_causes.append(action.cause)
            self._reform(action.why, action.broken)
        elif isinstance(action, actions.Arrived):
            self.rounds.arrived(action.worker_id)
        elif isinstance(action, actions.ReformIfStillWaiting):
            self._failure_reported.add(action.number)
            self._spawn(self._reform_if_still_waiting(action.number))
        elif isinstance(action, actions.AdvanceTo):
            self._rendezvous.advance_to(action.number)
        elif isinstance(action, actions.BeginFinishing):
            self.begin_finishing()
        elif isinstance(action, actions.SeeIfEnded):
            self.apply(forming.job_end(self.view()))
        elif isinstance(action, actions.SeeHandovers):
            self._see_handovers()

    def _form_wanted_round(self, reasons: list[str]) -> None:
        cause = self._wanted_causes[0] if self._wanted_causes else Cause.JOIN
        why = forming.summarize(reasons)
        self.apply(forming.next_round(self.view(), why, self._clock(), cause))

    def _form_round(self, members: list[str], why: str, cause: Cause) -> None:
        """Form the next round with `members`, for `cause` unless a round was wanted for
        another first: joiners among them become members."""
        self.phase, self._short_since = Phase.RUNNING, None
        self.tally.resets += 1
        self.tally.update_version += 1
        number = self.rounds.form(members, self.tally.update_version, why)
        cause = self._wanted_causes[0] if self._wanted_causes else cause
        self._wanted_causes.clear()
        self.timeline.formed(number, len(members), cause, why)
        for worker_id in members:
            if self._workers[worker_id].state is WorkerState.LAUNCHING:
                self._workers[worker_id].state = WorkerState.MEMBER  # a leaving one stays so
        self._save_soon()

    def _reform(self, why: str, broken: bool = False) -> None:
        """Ask for the next round; `broken`: a member died (see `RoundKeeper.want`)."""
        awaited = (lambda: forming.survivors_not_waiting(self.view())) if broken else None
        self.rounds.want(why, awaited)

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

    # --- what workers do -------------------------------------------------------------------

    def _on_wait(self, worker_id: str, after: int, commit: int) -> None:
        """A worker whose state holds `commit` commits waits for a round after `after`."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return
        if self._elastic is None or not self.phase.forms_rounds:
            return
        self._note_commit(worker, commit)
        self.apply(on_workers.caught_up(self.view(), after))
        if worker.state is WorkerState.LAUNCHING and worker.waiting_since is None:
            worker.waiting_since = self._clock()
        self.apply(on_workers.waiting(self.view(), worker, after, self._clock()))

    def _on_unreachable(self, report: PeersUnreachable) -> None:
        """Gather round `report.round`'s reports; the first one starts the wait for the others
        (`UNREACHABLE_SETTLE` heartbeat intervals, `UNREACHABLE_SETTLE_FLOOR` s at least),
        after which `reachability.cut_off` decides from all of them."""
        number, reports = self._unreachable
        if report.round != self._rendezvous.epoch or not self.phase.forms_rounds:
            return
        if number != report.round:
            number, reports = self._unreachable = (report.round, {})
            self._spawn(self._cut_off_after_settling(number))
        reports.setdefault(report.worker_id, set()).update(report.ranks)

    async def _cut_off_after_settling(self, number: int) -> None:
        interval = self._settings.heartbeat_interval
        await asyncio.sleep(max(UNREACHABLE_SETTLE * interval, UNREACHABLE_SETTLE_FLOOR))
        reports = self._unreachable[1] if self._unreachable[0] == number else {}
        self.apply(reachability.cut_off(self.view(), number, reports, self._clock()))

    async def _reform_if_still_waiting(self, number: int) -> None:
        await asyncio.sleep(self._settings.heartbeat_interval)
        if self._rendezvous.epoch == number and self.phase.forms_rounds:
            self._reform("a worker reported a failed collective", broken=True)

    def _look_for_stall(self, now: float) -> None:
        """Find the current round's stall, at most once every `STALL_LOOK_EVERY` s (it reads
        every member); log it once (and again when it changes); past --stall-timeout, the
        ranks behind have failed."""
        if now - self._stall_looked < STALL_LOOK_EVERY:
            return
        self._stall_looked = now
        number = self._rendezvous.epoch
        members = []
        for worker_id, slot in self._rendezvous.slots.items():
            progress = self._workers[worker_id].progress
            activity = progress.activity
            if activity is None or progress.round != number:
                steps = activity.steps if activity is not None else 0
                members.append(RankActivity(slot.rank, slot.hostname, 0, "", None, steps))
                continue
            blocked = progress.age(activity.blocked_for, now)
            members.append(
                RankActivity(slot.rank, slot.hostname, activity.seq, activity.kind, blocked,
                             activity.steps)
            )  # fmt: skip
        stall = find_stall(number, members, self._settings.stall_warning)
        previous, self.stall = self.stall, stall
        if stall is None:
            return
        if previous is None or _stall_key(previous) != _stall_key(stall):
            log.warning("%s", stall.line, extra={"event": "stall"})
        timeout = self._settings.stall_timeout
        if timeout is not None and stall.seconds >= timeout:
            behind = {m.rank for m in stall.missing}
            ids = [w for w, slot in self._rendezvous.slots.items() if slot.rank in behind]
            self.apply(on_workers.stalled(self.view(), ids, stall.line, now))

    def _tags(self, line: actions.Log) -> dict[str, Any]:
        """The `extra=` of a policy's `line`: its event, and the rank and host of its worker."""
        worker = self._workers.get(line.worker_id)
        slot = self._rendezvous.slot_of(line.worker_id) if worker is not None else None
        host = worker.hostname if worker is not None else None
        return tags(line.event, rank=slot.rank if slot is not None else None, host=host)

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
        self._leavers = {w for w in self._leavers if workers[w].handing_over}
        if self._leavers:
            self.apply(leaving.handovers(self.view(), self._watcher.usable()))


def _ended_unwatched(worker: Worker) -> bool:
    return worker.process is not None and worker.process.ended_unwatched


def _stall_key(stall: StallReport) -> tuple[int, int, str, tuple[int, ...]]:
    """What makes a stall the same one: its round, collective and missing ranks."""
    missing = tuple(m.rank for m in stall.missing)
    return stall.round, stall.collective.seq, stall.collective.kind, missing
