"""The re-forming policy: from a read-only view of the job, an event and the time, a decision.

Pure: no I/O, no clock, no mutation of the view. `Job` gathers the view, asks one of the
functions below, and carries the decision's actions out in order; the decision's reason goes
to the log (`--verbose`) and to `/v1/status`, so a user reads the same sentence the tests
assert on.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.policy.planning import free_slots, next_members
from elastic.driver.settings import ElasticSettings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import SlotInfo

JOIN_WINDOW = 3.0  # seconds ready joiners wait for those launched with them before a round
FLEET_LOSS_REPEATS = 3  # the same loss of every worker, this many times in a row, ends the job
LOST_EXIT = 255  # ssh's code for a host it lost, and a detached worker's with no exit status


class Cause(enum.StrEnum):
    """What a round was formed for, as the metrics and the page count re-forms."""

    START = "start"  # the job's first round
    FAILURE = "failure"  # a member died or was declared dead
    JOIN = "join"  # new workers joined
    LEAVE = "leave"  # a member left (SIGTERM, its slot went away, it exited early)
    PREEMPTION = "preemption"  # its host had a preemption notice
    DRAIN = "drain"  # an operator drained its host
    DISCOVERY = "discovery"  # discovery stopped offering its host
    DRIVER_RESTART = "driver-restart"  # a restarted driver lost or never saw a round


class Phase(enum.Enum):
    """Where the job is in its life. Only RUNNING and SHORT form rounds or launch workers."""

    RUNNING = "running"  # training (or starting) with at least --min-np workers
    SHORT = "short"  # fewer than --min-np workers: waiting up to --elastic-timeout for more
    FINISHING = "finishing"  # training is over (a member finished): the rest end their part
    ENDED = "ended"  # the job's result is set: every worker is being stopped
    ABANDONED = "abandoned"  # another driver took the job over: its workers are left to it

    @property
    def forms_rounds(self) -> bool:
        return self in (Phase.RUNNING, Phase.SHORT)


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FormRound:
    """Form the next round with `members`, in rank order, and tell the previous members;
    `cause`: what it is for, unless a wanted round's causes say otherwise (`Reform`)."""

    members: tuple[str, ...]
    cause: Cause = Cause.JOIN


@dataclass(frozen=True)
class WaitForWorkers:
    """Enter the SHORT phase: fewer than --min-np workers since `since`."""

    since: float


@dataclass(frozen=True)
class FillSlots:
    """Launch workers on the free slots of usable hosts (see `fill_slots`)."""


@dataclass(frozen=True)
class Launch:
    """Start one worker on each (hostname, slot index) of `places`."""

    places: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AskToLeave:
    """Ask worker `worker_id` to leave at its next commit, for `why` (a `cause` of its own);
    `along`: the others asked to leave with it, none of which can hold its state for it."""

    worker_id: str
    why: str
    cause: Cause = Cause.LEAVE
    along: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StopWorker:
    """Stop worker `worker_id` for good (it never became a member), for `why`."""

    worker_id: str
    why: str


@dataclass(frozen=True)
class HandOver:
    """Worker `worker_id` leaves for `why` once another member holds its newest commit: it
    stays a member until then (see `policy.leaving`)."""

    worker_id: str
    why: str
    cause: Cause = Cause.LEAVE


@dataclass(frozen=True)
class LetGo:
    """Exclude the leaving worker `worker_id` from the job, for `why`, and re-form."""

    worker_id: str
    why: str


@dataclass(frozen=True)
class Finish:
    """End the job with exit `code`; `message` is its last line."""

    code: int
    message: str = ""


@dataclass(frozen=True)
class Log:
    """Tell the user `line` at `level` ("info", "warning" or "error"); it reports `event` (see
    `elastic.driver.logs.tags`), about the worker `worker_id` if one is named."""

    level: str
    line: str
    event: str = "log"
    worker_id: str = ""


@dataclass(frozen=True)
class ShowProgress:
    """Tell the user `line` as a progress line (the caller limits how often)."""

    line: str


@dataclass(frozen=True)
class FleetLoss:
    """How every worker of the job was lost: at the job's newest commit `commit`, its failed
    workers ending as `exits` says (distinct words, sorted), `progress` commits after the
    previous such loss (or the job's start): the step they reached. `times`: how many losses
    in a row were `alike`."""

    commit: int
    exits: tuple[str, ...]
    progress: int
    times: int = 1

    def alike(self, other: FleetLoss) -> bool:
        """The same exits at the same step, give or take the one commit that the workers'
        last heartbeats may not have carried (the driver learns commits from them)."""
        return self.exits == other.exits and abs(self.progress - other.progress) <= 1


@dataclass(frozen=True)
class RecordFleetLoss:
    """Remember that every worker was lost (`loss`): no commit since, or the same loss
    `FLEET_LOSS_REPEATS` times in a row, ends the job."""

    loss: FleetLoss


@dataclass(frozen=True)
class MarkEnded:
    """Record that worker `worker_id` ended: `failed` (its state goes with it) or exited."""

    worker_id: str
    failed: bool


@dataclass(frozen=True)
class MarkExiting:
    """Worker `worker_id` said it exits: judge it by its exit code from now on."""

    worker_id: str


@dataclass(frozen=True)
class TakeOut:
    """Take worker `worker_id` out of the job now, for `why` (its host failed: see
    `FailureScope.HOST`): it hears that round `number` is broken, so that a collective it is
    blocked in fails at once and it asks to join again, and is refused; it is stopped
    (SIGTERM, SIGKILL after --stop-grace). Its exit is no failure of its own."""

    worker_id: str
    why: str
    number: int


@dataclass(frozen=True)
class Signal:
    """Send worker `worker_id`'s process SIGKILL (`kill`) or SIGTERM."""

    worker_id: str
    kill: bool


@dataclass(frozen=True)
class CoolDown:
    """A worker on `hostname` failed for `why`: keep the host out for its cooldown."""

    hostname: str
    why: str


@dataclass(frozen=True)
class BreakRound:
    """Tell every live worker that round `number` is broken, for `why` (once per round)."""

    number: int
    why: str


@dataclass(frozen=True)
class Reform:
    """Ask for the next round, for `why`; `broken`: a member died, and the round waits for
    every survivor to come back to the rendezvous (see `RoundBatcher`); `cause`: what for."""

    why: str
    broken: bool
    cause: Cause


@dataclass(frozen=True)
class Arrived:
    """Member `worker_id` is back at the rendezvous for the round that is wanted."""

    worker_id: str


@dataclass(frozen=True)
class ReformIfStillWaiting:
    """Re-form after one heartbeat interval if round `number` is still the newest then."""

    number: int


@dataclass(frozen=True)
class AdvanceTo:
    """Number the rounds on from `number`: a worker is in it, formed by an earlier driver."""

    number: int


@dataclass(frozen=True)
class BeginFinishing:
    """Training is over: no new round or worker; joiners are stopped, the others end."""


@dataclass(frozen=True)
class SeeIfEnded:
    """Once the actions before it are done: end the job if no member lives (`job_end`)."""


@dataclass(frozen=True)
class SeeHandovers:
    """Once the actions before it are done: let go the leavers whose state is held
    elsewhere (`leaving.handovers`)."""


Action = (
    FormRound
    | WaitForWorkers
    | FillSlots
    | Launch
    | AskToLeave
    | StopWorker
    | HandOver
    | LetGo
    | Finish
    | Log
    | ShowProgress
    | RecordFleetLoss
    | MarkEnded
    | MarkExiting
    | TakeOut
    | Signal
    | CoolDown
    | BreakRound
    | Reform
    | Arrived
    | ReformIfStillWaiting
    | AdvanceTo
    | BeginFinishing
    | SeeIfEnded
    | SeeHandovers
)


@dataclass(frozen=True)
class Decision:
    """What to do, in order, and why, in words a user reads in the log and the status."""

    actions: tuple[Action, ...]
    reason: str


NOTHING = Decision((), "")


# --- the view ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What the policy may read. Workers are the driver's records: read, never written."""

    phase: Phase
    elastic: ElasticSettings | None  # None: a static job
    workers: Mapping[str, Worker]  # every worker launched, by id, in launch order
    members: Sequence[str]  # the current round's members, in rank order
    waiting: Set[str]  # ids waiting at the rendezvous for the next round
    resets: int  # rounds formed after the first
    short_since: float | None  # when the job fell short of --min-np (SHORT phase)
    newest_commit: int  # the newest commit count any worker reported
    fleet_loss: FleetLoss | None  # how every worker was last lost, if it ever was
    round: int = 0  # the newest round's number
    slots: Mapping[str, SlotInfo] = field(default_factory=dict)  # its members' places
    command: Sequence[str] = ()  # what each worker runs
    round_wanted: bool = False  # a next round is asked for and not formed yet
    failures_reported: Set[int] = frozenset()  # rounds a member said failed, unseen here
    checkpoint_dir: str = ""  # where workers write durable commits (--checkpoint-dir)

    def where(self, worker: Worker) -> str:
        """ "rank R on host H" for a member of the newest round, else "worker ID on host H"."""
        slot = self.slots.get(worker.worker_id)
        name = f"rank {slot.rank}" if slot is not None else f"worker {worker.worker_id}"
        return f"{name} on host {worker.hostname}"

    def alive_besides(self, *gone: Worker) -> bool:
        """Whether any started worker other than those `gone` is alive."""
        return any(
            w.state.alive and w.process is not None
            for w in self.workers.values()
            if all(w is not other for other in gone)
        )

    def launching(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state is WorkerState.LAUNCHING]

    def ready_joiners(self) -> list[Worker]:
        """Launched workers, not yet members, that wait at the rendezvous."""
        return [w for w in self.launching() if w.worker_id in self.waiting]

    def staying_members(self) -> int:
        return sum(1 for w in self.members if self.workers[w].state is WorkerState.MEMBER)


# --- decisions ---------------------------------------------------------------------------


def next_round(view: JobView, why: str, now: float, cause: Cause = Cause.JOIN) -> Decision:
    """Form the next round from the surviving members (leavers still handing their state
    over among them) and the joiners waiting at the rendezvous, capped at --max-np.

    Fewer than --min-np: no round; the job waits (SHORT) and fills free slots. Past
    --reset-limit: the job ends with 1."""
    elastic = view.elastic
    if elastic is None or not view.phase.forms_rounds:
        return NOTHING
    handing_over = frozenset(
        w for w in view.members if view.workers[w].handing_over and view.workers[w].state.alive
    )
    joiners = [w.worker_id for w in view.ready_joiners()]
    members = next_members(survivors(view), joiners, elastic.max_np, handing_over)
    if len(members) < elastic.min_np:
        reason = (
            f"{why}: {len(members)} worker(s) left, fewer than --min-np {elastic.min_np}; "
            f"waiting up to {elastic.elastic_timeout:g} s (--elastic-timeout) for more"
        )
        if view.short_since is not None:  # said so when the wait began
            return Decision((FillSlots(),), reason)
        return Decision((Log("warning", reason), WaitForWorkers(now), FillSlots()), reason)
    limit = elastic.reset_limit
    if limit is not None and view.resets + 1 > limit:
        message = f"reset limit reached: {limit} re-rendezvous (--reset-limit); {why}"
        return Decision((Finish(1, message),), message)
    return Decision((FormRound(tuple(members), cause),), why)


def survivors(view: JobView) -> list[str]:
    """The current round's members that go on into the next: members, and leavers still
    handing their state over."""
    return [
        w
        for w in view.members
        if view.workers[w].state is WorkerState.MEMBER
        or (view.workers[w].handing_over and view.workers[w].state.alive)
    ]


def survivors_not_waiting(view: JobView) -> set[str]:
    """The survivors a broken round's successor waits for: it is of use only once every one
    of them has come to the rendezvous, so forming it then costs no time, and deaths seen
    meanwhile are taken into the same round."""
    return {w for w in survivors(view) if w not in view.waiting}


def joiner_waiting(view: JobView, now: float) -> Decision:
    """A joiner waits at the rendezvous: form a round once every launched worker waits."""
    launching = view.launching()
    if launching and all(w.worker_id in view.waiting for w in launching):
        return next_round(view, f"{len(launching)} worker(s) joined", now)
    return NOTHING


def tick(view: JobView, now: float) -> Decision:
    """The periodic look at the job.

    Ready joiners form a round once the first of them has waited `JOIN_WINDOW` seconds,
    without those launched with them that are still starting (one hung joiner must not hold
    the others back until it is timed out), unless --max-np members stay already. A job short
    of --min-np for longer than --elastic-timeout ends with 1; until then it says how long
    it still waits."""
    elastic = view.elastic
    if elastic is None or not view.phase.forms_rounds:
        return NOTHING
    if view.short_since is not None:
        waited = now - view.short_since
        if waited > elastic.elastic_timeout:
            message = (
                f"fewer than --min-np {elastic.min_np} workers for "
                f"{elastic.elastic_timeout:g} s (--elastic-timeout)"
            )
            return Decision((Finish(1, message),), message)
    ready = view.ready_joiners()
    full = elastic.max_np is not None and view.staying_members() >= elastic.max_np
    if ready and not full and now - min(w.waiting_since or now for w in ready) >= JOIN_WINDOW:
        starting = len(view.launching()) - len(ready)
        why = f"{len(ready)} worker(s) joined, {starting} still starting"
        decision = next_round(view, why, now)
        if any(isinstance(action, FormRound | Finish) for action in decision.actions):
            return decision
    if view.short_since is not None:
        alive = sum(1 for w in view.workers.values() if w.state.alive and w.process is not None)
        left = elastic.elastic_timeout - (now - view.short_since)
        line = (
            f"waiting for workers: {alive} alive, --min-np {elastic.min_np}, {left:.0f} s left "
            "(--elastic-timeout)"
        )
        return Decision((ShowProgress(line),), "")
    return NOTHING


def job_end(view: JobView) -> Decision:
    """Once no member of the current round is alive: 0 when none failed; in an elastic job
    the last failure's code when some did (a static job has ended at its first failure)."""
    members = [view.workers[w] for w in view.members]
    if any(w.state.alive for w in members):
        return NOTHING
    failed = [w for w in members if w.state is WorkerState.FAILED]
    if not failed:
        return Decision((Finish(0),), "every member of the last round ended with 0")
    if view.elastic is None:
        return NOTHING
    message = f"{len(failed)} of the {len(members)} worker(s) of the last round failed"
    return Decision((Finish(failed[-1].exit_code or 1, message),), message)


def fleet_lost(view: JobView, last: Worker, now: float) -> Decision:
    """`last` failed, and no other worker is alive. The job ends with `last`'s exit code when
    new workers could only fail the same way:

    * no commit was made since the job started, or since every worker was last lost (a
      script that fails before its first commit);
    * every worker whose failure lost the fleet (`lost_with`) exited with an error code (an
      exception, `sys.exit(n)`; not a signal, a lost host or a hang: `exited_with_error`);
    * the same loss (the same exits at the same step, `FleetLoss.alike`) happened
      `FLEET_LOSS_REPEATS` times in a row.

    Otherwise (a fleet lost to preemption: signals, vanished hosts, hangs) it starts again on
    the offered hosts within --elastic-timeout, saying that the state is lost, or, with
    --checkpoint-dir, that the new workers resume from the newest durable commit."""
    elastic = view.elastic
    assert elastic is not None
    commit, previous = view.newest_commit, view.fleet_loss
    code = last.exit_code or 1
    if commit == 0 or (previous is not None and commit == previous.commit):
        since = "since the last such loss" if commit else "since the job started"
        message = f"every worker of the job failed, with no commit {since}"
        return Decision((Finish(code, message),), message)
    failures = lost_with(view, last)
    exits = tuple(sorted({how_lost(w) for w in failures}))
    if all(exited_with_error(w) for w in failures):
        message = (
            f"every worker of the job exited with an error ({', '.join(exits)}): the job "
            "ends instead of starting new workers that would fail the same way (their output "
            "says why)"
        )
        return Decision((Finish(code, message),), message)
    loss = FleetLoss(commit, exits, commit - (previous.commit if previous is not None else 0))
    if previous is not None and loss.alike(previous):
        loss = FleetLoss(loss.commit, loss.exits, loss.progress, previous.times + 1)
    if loss.times >= FLEET_LOSS_REPEATS:
        message = (
            f"every worker of the job was lost the same way {loss.times} times in a row "
            f"({', '.join(exits)}, {loss.progress} commit(s) after they started): the job ends "
            "instead of starting new workers again"
        )
        return Decision((Finish(code, message),), message)
    if view.checkpoint_dir:
        state = f"new workers resume from the newest durable commit in {view.checkpoint_dir}"
    else:
        state = f"its training state (commit {commit}) is lost with them"
    reason = (
        f"every worker of the job failed: {state}; starting new workers on the offered hosts "
        f"(up to {elastic.elastic_timeout:g} s, --elastic-timeout)"
    )
    waiting = () if view.short_since is not None else (WaitForWorkers(now),)
    return Decision((Log("warning", reason), RecordFleetLoss(loss), *waiting, FillSlots()), reason)


def lost_with(view: JobView, last: Worker) -> list[Worker]:
    """The workers whose failures lost the fleet: the current round's failed members, and
    `last`. Workers taken out with a failed host (stopped) are not among them."""
    failed = [
        w
        for w in (view.workers[m] for m in view.members)
        if w.state is WorkerState.FAILED and w is not last
    ]
    return [*failed, last]


def _signal_of(worker: Worker) -> int | None:
    """The signal that ended `worker`, known or read from a 128+N exit code."""
    number = worker.process.signal if worker.process is not None else None
    code = worker.exit_code
    if number is None and code is not None and code < 0:
        number = -code
    elif number is None and code is not None and 128 < code < 160:
        number = code - 128
    return number


def how_lost(worker: Worker) -> str:
    """How a failed `worker` ended, in a few words: by a signal, with an exit code, or not
    yet (declared dead: hung, silent, stalled, and being killed)."""
    number = _signal_of(worker)
    if number is not None:
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    if worker.exit_code is None:
        return "declared dead"
    return f"exit code {worker.exit_code}"


def exited_with_error(worker: Worker) -> bool:
    """Whether `worker` ended by exiting with an error code of its own: not by a signal, not
    declared dead, not with `LOST_EXIT` (ssh lost its host; no exit status was left)."""
    code = worker.exit_code
    return _signal_of(worker) is None and code not in (None, 0, LOST_EXIT)


def fill_slots(view: JobView, hosts: Sequence[HostSpec]) -> Decision:
    """Launch workers on the free slots of `hosts` (offered, not in cooldown, resolvable), up
    to --max-np workers that stay: leavers still hold their slots but do not count."""
    elastic = view.elastic
    if elastic is None or not view.phase.forms_rounds:
        return NOTHING
    alive = [w for w in view.workers.values() if w.state.alive and w.process is not None]
    occupied: dict[str, set[int]] = {}
    for worker in alive:
        occupied.setdefault(worker.hostname, set()).add(worker.host_slot)
    staying = sum(1 for w in alive if w.state is not WorkerState.LEAVING)
    wanted = elastic.max_np - staying if elastic.max_np is not None else 1 << 30
    places = free_slots(list(hosts), occupied, wanted)
    if not places:
        return NOTHING
    return Decision((Launch(tuple(places)),), f"{len(places)} free slot(s) to fill")


def together(asked: Sequence[AskToLeave]) -> tuple[Action, ...]:
    """`asked`, each told who else leaves with it (`AskToLeave.along`), then, for several, one
    look for holders of their state once all are asked (`SeeHandovers`): a host's workers
    hand their state over to a worker that stays, not to one another, and leave in one
    round."""
    ids = frozenset(a.worker_id for a in asked)
    asks = tuple(AskToLeave(a.worker_id, a.why, a.cause, ids - {a.worker_id}) for a in asked)
    return (*asks, SeeHandovers()) if len(asks) > 1 else asks


def hosts_removed(
    view: JobView,
    removed: Sequence[str],
    discovered: Set[str],
    noticed: Mapping[str, float] | None = None,
    drained: Set[str] = frozenset(),
) -> Decision:
    """Workers on a host that discovery no longer offers leave the job (no rollback, no
    cooldown); a host merely in cooldown (still `discovered`) keeps its live workers. A host
    in `noticed` (hostname -> when it goes, on the driver's clock) is offered but about to go,
    one in `drained` was taken out by an operator: the reason says so."""
    noticed = noticed or {}

    def why(hostname: str) -> str:
        if hostname in drained:
            return f"host {hostname} is drained (elasticrun drain)"
        if hostname in noticed:
            return f"host {hostname} is about to be preempted (notice)"
        return f"host {hostname} was removed by discovery"

    def cause(hostname: str) -> Cause:
        if hostname in drained:
            return Cause.DRAIN
        return Cause.PREEMPTION if hostname in noticed else Cause.DISCOVERY

    actions = together([
        AskToLeave(worker.worker_id, why(hostname), cause(hostname))
        for hostname in removed
        if hostname not in discovered
        for worker in view.workers.values()
        if worker.hostname == hostname and worker.state.alive
    ])  # fmt: skip
    if not actions:
        return NOTHING
    gone = [h for h in removed if h not in discovered]
    if all(h in drained for h in gone):
        return Decision(actions, f"host(s) {', '.join(gone)} drained")
    if all(h in noticed for h in gone):
        return Decision(actions, f"host(s) {', '.join(gone)} about to be preempted (notice)")
    return Decision(actions, f"host(s) {', '.join(gone)} removed by discovery")


def hosts_resized(view: JobView, slots: Mapping[str, int]) -> Decision:
    """A host that now offers fewer slots (`slots`: its new count) keeps the workers of its
    first slots; those on slots beyond the count leave the job (no rollback, no cooldown).
    More slots are filled as any free slots are (`fill_slots`)."""
    actions = together([
        AskToLeave(worker.worker_id, f"host {worker.hostname} now offers {count} slot(s)")
        for hostname, count in slots.items()
        for worker in view.workers.values()
        if worker.hostname == hostname and worker.state.alive and worker.host_slot >= count
    ])  # fmt: skip
    if not actions:
        return NOTHING
    leaving = {view.workers[a.worker_id].hostname for a in actions if isinstance(a, AskToLeave)}
    shrunk = ", ".join(f"{h}:{n}" for h, n in slots.items() if h in leaving)
    return Decision(actions, f"host(s) offer fewer slots: {shrunk}")


REASONS_SHOWN = 3  # a round wanted for more reasons names this many and counts the rest


def summarize(reasons: Sequence[str]) -> str:
    """One line for the reasons a round was wanted for, in order, each once."""
    distinct = list(dict.fromkeys(reasons))
    if len(distinct) <= REASONS_SHOWN:
        return "; ".join(distinct)
    shown = "; ".join(distinct[: REASONS_SHOWN - 1])
    return f"{shown}; and {len(distinct) - REASONS_SHOWN + 1} more"
