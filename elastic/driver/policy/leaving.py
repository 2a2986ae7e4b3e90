"""Leaving the job at a commit (SIGTERM, a removed host) without losing the state. Pure.

A member asked to leave goes at its next commit: no rollback, no cooldown. When it holds the
only copy of the newest commit, it first stays a member (`HandOver`) until another member
reports holding that commit; a worker is launched on a free slot to take it over when no
other one is there, and when none can be, the leaver goes and its state with it (said so).
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.policy.actions import (
    NOTHING,
    Action,
    BeginFinishing,
    Decision,
    HandOver,
    Launch,
    LetGo,
    Log,
    MarkExiting,
    Reform,
    SeeHandovers,
    StopWorker,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.forming import fill_slots
from elastic.driver.policy.view import JobView
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.leave import EXIT_REASONS, FINISHED


def handed_over(view: JobView, worker: Worker, along: Set[str] = frozenset()) -> bool:
    """Whether another member that stays holds `worker`'s newest commit (or it has none);
    those `along` (asked to leave with it) do not stay."""
    return worker.commit == 0 or any(
        other.state is WorkerState.MEMBER and other.commit >= worker.commit
        for other in (view.workers[w] for w in view.members)
        if other is not worker and other.worker_id not in along
    )


def leave(
    view: JobView,
    worker_id: str,
    why: str,
    cause: Cause = Cause.LEAVE,
    along: Set[str] = frozenset(),
) -> Decision:
    """`worker_id` is asked to leave for `why` (`cause`), with those `along`: a joiner is
    stopped; a member alone goes at once (static job, or a member that stays holds its
    state) or hands its state over first, looking for a holder at once. With others `along`
    it always waits as a leaver, its state held or not: the decision that asked them all
    looks once all are asked and lets them go in one round (`host_changes.together`,
    `handovers`)."""
    worker = view.workers[worker_id]
    if worker.state is WorkerState.LAUNCHING:
        return Decision((StopWorker(worker_id, why),), f"worker {worker_id} is stopped: {why}")
    if worker.state is not WorkerState.MEMBER:
        return NOTHING
    held = handed_over(view, worker, along)
    if view.elastic is None or (held and not along):
        return Decision(let_go(view, worker, why, cause), f"worker {worker_id} leaves: {why}")
    if held:  # its state is safe: it only waits to go in the round its companions go in
        return Decision((HandOver(worker_id, why, cause),), f"worker {worker_id} leaves: {why}")
    reason = f"worker {worker_id} leaves ({why}) once another worker holds commit {worker.commit}"
    line = (
        f"{view.where(worker)} leaves the job ({why}) once another worker holds its state "
        f"(commit {worker.commit})"
    )
    look = () if along else (SeeHandovers(),)
    return Decision(
        (HandOver(worker_id, why, cause), Log("info", line, "leave", worker_id), *look), reason
    )


def asked(view: JobView, worker: Worker, reason: str) -> Decision:
    """`worker` asked to leave for `reason`. A reason that is an exit (its script returned,
    or failed) means it exits: it is judged by its exit code from now on, and a member that
    finished (a leaver still handing its state over among them) ends training. Any other
    reason is a request to leave the job (`leave`)."""
    if not worker.state.alive:
        return NOTHING
    if reason not in EXIT_REASONS:
        return leave(view, worker.worker_id, reason)
    finishing = reason == FINISHED and worker.worker_id in view.slots
    actions = (MarkExiting(worker.worker_id), *((BeginFinishing(),) if finishing else ()))
    return Decision(actions, f"{view.where(worker)} exits: {reason}")


def let_go(view: JobView, worker: Worker, why: str, cause: Cause) -> tuple[Action, ...]:
    """Exclude the leaving `worker` for `why` (`cause`) and, in an elastic job, re-form
    without it."""
    where = view.where(worker)
    reform = (Reform(f"{where} leaves: {why}", False, cause),) if view.elastic else ()
    said = Log("info", f"{where} leaves the job: {why}", "leave", worker.worker_id)
    return (LetGo(worker.worker_id, why), said, *reform)


def handovers(view: JobView, hosts: Sequence[HostSpec]) -> Decision:
    """Let the leavers go, in one round, once another member holds each one's state. While
    no other worker is there to take a leaver's state over, launch one on a free slot of
    `hosts`; when none can be launched, that leaver goes with its state (said so). A leaver
    whose state is held waits for the others: leavers asked together (a removed host's
    workers) go in one round, as Horovod re-forms once per host change."""
    leavers = [w for w in view.workers.values() if w.handing_over and w.state.alive]
    stranded: set[str] = set()
    launch: Decision | None = None
    waiting = needs_launch = False
    for worker in leavers:
        if handed_over(view, worker):
            continue
        if any(
            w.state in (WorkerState.LAUNCHING, WorkerState.MEMBER) and w.process is not None
            for w in view.workers.values()
        ):
            waiting = True  # a member or a joiner will report holding the commit
            continue
        launch = launch or fill_slots(view, hosts)
        if any(isinstance(a, Launch) for a in launch.actions):
            waiting = needs_launch = True
            continue
        stranded.add(worker.worker_id)
    reason = f"{len(leavers)} worker(s) handing their state over"
    if waiting:
        return Decision(launch.actions, reason) if needs_launch and launch else NOTHING
    actions: list[Action] = []
    for worker in leavers:
        if worker.worker_id not in stranded:
            holds = f"another worker holds its state now (commit {worker.commit})"
            actions += let_go(
                view, worker, f"{worker.leave_reason}; {holds}", Cause(worker.leave_cause)
            )
            continue
        actions.append(
            Log(
                "warning",
                f"worker {worker.worker_id} takes the only copy of the job's state (commit "
                f"{worker.commit}) with it: no other worker can be started to take it over",
            )
        )
        why = f"{worker.leave_reason}; nobody can take its state over"
        actions += let_go(view, worker, why, Cause(worker.leave_cause))
    return Decision(tuple(actions), reason) if actions else NOTHING
