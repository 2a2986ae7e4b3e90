"""What a worker's exit, verdict, failure or wait at the rendezvous means for the job. Pure.

The conductor records what a worker reported (its commit, since when it waits) before it
asks; the decisions below change the worker records only through their actions (`MarkEnded`),
so a follow-up that depends on the changed records is an action of its own (`SeeIfEnded`,
`SeeHandovers`, `FillSlots`), decided when its turn comes.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from elastic.driver.policy import end_causes
from elastic.driver.policy.actions import (
    NOTHING,
    Action,
    AdvanceTo,
    Arrived,
    BeginFinishing,
    BreakRound,
    CoolDown,
    Decision,
    FillSlots,
    Finish,
    Log,
    MarkEnded,
    Reform,
    ReformIfStillWaiting,
    SeeHandovers,
    SeeIfEnded,
    Signal,
    TakeOut,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.fleet_loss import fleet_lost
from elastic.driver.policy.forming import joiner_waiting
from elastic.driver.policy.liveness import Ending, Verdict, ending
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.view import JobView
from elastic.driver.settings import FailureScope
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import StallReport


def describe_exit(worker: Worker) -> str:
    """How `worker`'s process ended, in words: its signal or its exit code."""
    number = worker.process.signal if worker.process is not None else None
    if number is not None:
        return f"was killed by signal {signal.Signals(number).name} (exit code {worker.exit_code})"
    return f"exited with code {worker.exit_code}"


def exited(view: JobView, worker: Worker, ended_unwatched: bool, now: float) -> Decision:
    """`worker`'s process ended with `worker.exit_code` (see `ending` for what that means);
    `ended_unwatched`: while no driver watched it."""
    kind = ending(worker, ended_unwatched)
    where, code = view.where(worker), worker.exit_code
    was_member = worker.worker_id in view.slots
    left = MarkEnded(worker.worker_id, failed=False, cause=end_causes.LEFT)
    if kind is Ending.IGNORED:
        return NOTHING
    if kind is Ending.FAILED:
        return failed(view, worker, describe_exit(worker), now, end_causes.of_exit(worker))
    if kind is Ending.CANNOT_RUN:
        program = view.command[0] if view.command else "its command"
        message = (
            f"{where} could not run {program!r} (exit code {code}: "
            f"{'not found' if code == 127 else 'not executable'}); its output says more"
        )
        return Decision((Finish(code or 1, message),), message)
    if kind is Ending.LEFT:
        if code == 0 and view.phase is Phase.FINISHING:  # it finished before it could leave
            return Decision((left, SeeIfEnded()), f"{where} left as training ended")
        if code == 0:
            return Decision((left, FillSlots()), f"{where} left: its slot is free")
        # It may have died before it left (a removed host's workers killed before their
        # commit): its round's survivors may wait on it, or on a peer that went to the next
        # round, in a collective that only the round's break ends.
        line = f"{where} left with exit code {code}"
        if was_member:
            breaks: tuple[Action, ...] = (
                BreakRound(view.round, line),
                Reform(line, broken=True, cause=Cause.FAILURE),
            )
        else:
            breaks = (BreakRound(view.round - 1, line),)
        return Decision((left, Log("warning", line), *breaks, FillSlots()), line)
    if kind is Ending.LEFT_UNSEEN:  # its leave was not saved (etcd was down)
        line = (
            f"{where} exited with code 0 while no driver watched it, without having said "
            "that it finished: counted as having left the job"
        )
        actions: list[Action] = [left, Log("warning", line)]
        if was_member and view.elastic is not None:
            actions.append(Reform(f"{where} left", broken=False, cause=Cause.LEAVE))
        actions.append(FillSlots() if view.alive_besides(worker) else SeeIfEnded())
        return Decision(tuple(actions), line)
    finishing = (BeginFinishing(),) if was_member else ()  # a member's end is training's end
    ended = MarkEnded(worker.worker_id, failed=False, cause=end_causes.FINISHED)
    return Decision((ended, *finishing, SeeIfEnded()), f"{where} finished")


def failed(view: JobView, worker: Worker, reason: str, now: float, cause: str) -> Decision:
    """`worker` died for `reason` (`cause`: the same in a word, see `end_causes`). A static
    job ends with its exit code. An elastic one cools its host down and, with --failure-scope
    host (the default, as horovodrun), takes the host's other live workers out of the job
    with it (`host_fellows`); it breaks the round (or, for a leaver, the round it left, whose
    collectives its peers may still be in) when a member is gone, and re-forms from the
    survivors; when no worker is left, see `fleet_lost`."""
    where = view.where(worker)
    line = f"{where} {reason}"
    dead = MarkEnded(worker.worker_id, failed=True, cause=cause)
    if view.elastic is None:
        message = f"{line}; stopping the other workers"
        return Decision((dead, Finish(worker.exit_code or 1, message)), message)
    actions: list[Action] = [
        dead,
        Log("error", line, "failure", worker.worker_id),
        CoolDown(worker.hostname, reason),
    ]
    if not view.phase.forms_rounds:
        return Decision((*actions, SeeIfEnded()), line)
    fellows = host_fellows(view, worker)
    for fellow in fellows:
        why = f"its host {worker.hostname} failed with {where} (--failure-scope host)"
        said = f"{view.where(fellow)} leaves the job: {why}"
        actions += [Log("warning", said, "leave", fellow.worker_id),
                    TakeOut(fellow.worker_id, why, view.round)]  # fmt: skip
    if worker.worker_id in view.slots or any(f.worker_id in view.slots for f in fellows):
        actions += [BreakRound(view.round, line), Reform(line, True, Cause.FAILURE)]
    elif worker.state is WorkerState.LEAVING:
        actions.append(BreakRound(view.round - 1, line))
    if view.alive_besides(worker, *fellows):
        actions += [FillSlots(), SeeHandovers()]  # refill its slot unless it cools down
        return Decision(tuple(actions), line)
    lost = fleet_lost(view, worker, now)
    return Decision((*actions, *lost.actions), f"{line}; {lost.reason}")


def host_fellows(view: JobView, worker: Worker) -> list[Worker]:
    """The live workers on `worker`'s host that leave the job with it when it fails: all of
    them with --failure-scope host, none with --failure-scope worker."""
    assert view.elastic is not None
    if view.elastic.failure_scope is FailureScope.WORKER:
        return []
    return [
        w
        for w in view.workers.values()
        if w.hostname == worker.hostname
        and w is not worker
        and w.state.alive
        and w.process is not None
    ]


def judged(
    view: JobView, worker: Worker, verdict: Verdict, start_timeout: float, now: float
) -> Decision:
    """The liveness watch gave `worker` a `verdict`: a lingering leaver is sent SIGTERM; any
    other is killed and has failed. A static job whose worker did not join in time ends,
    naming every rank that has not joined."""
    if not worker.state.alive:
        return NOTHING  # it ended since it was judged
    where = view.where(worker)
    if verdict is Verdict.LINGERING:
        return Decision((Signal(worker.worker_id, kill=False),), f"{where} {verdict.value}")
    kill = Signal(worker.worker_id, kill=True)
    if verdict is Verdict.NOT_JOINED:
        if view.elastic is None:
            missing = sorted(
                (slot.rank, w.hostname)
                for w in view.workers.values()
                if w.state.alive and w.process is not None and not w.joined
                if (slot := view.slots.get(w.worker_id)) is not None
            )
            hosts = ", ".join(dict.fromkeys(host for _, host in missing))
            message = (
                f"rank(s) {[rank for rank, _ in missing]} on host(s) {hosts} did not join the "
                f"rendezvous within {start_timeout:g} s (--start-timeout)"
            )
            return Decision((kill, Finish(1, message)), message)
        reason = f"did not join within {start_timeout:g} s (--start-timeout)"
    else:
        reason = verdict.value
    decision = failed(view, worker, reason, now, end_causes.of_verdict(verdict))
    return Decision((kill, *decision.actions), decision.reason)


def waiting(view: JobView, worker: Worker, after: int, now: float) -> Decision:
    """`worker` waits at the rendezvous for a round after `after`. A joiner may complete the
    next round (`joiner_waiting`); a member back from its round is one fewer the wanted round
    waits for, and a member that saw its round fail before the driver saw a death has the
    job re-form after one heartbeat interval, unless the death shows up first."""
    if view.elastic is None or not view.phase.forms_rounds or not worker.state.alive:
        return NOTHING
    if worker.state is WorkerState.LAUNCHING:
        return joiner_waiting(view, now)
    if worker.state is not WorkerState.MEMBER or after < view.round:
        return NOTHING
    if view.round_wanted:
        return Decision((Arrived(worker.worker_id),), "")
    if after in view.failures_reported:
        return NOTHING
    reason = f"{view.where(worker)} reports round {after} failed"
    return Decision((ReformIfStillWaiting(after),), reason)


def caught_up(view: JobView, number: int) -> Decision:
    """A worker is in round `number`, newer than any this driver knows: an earlier driver
    formed it and died before saving it (etcd was down). Break it and form a newer one from
    the workers this driver knows; those it does not know are refused when they call."""
    if number <= view.round or view.elastic is None or not view.phase.forms_rounds:
        return NOTHING
    line = (
        f"a worker is in round {number}, which the previous driver formed but never saved "
        f"(this driver resumed at round {view.round}): re-forming"
    )
    actions = (
        Log("warning", line),
        AdvanceTo(number),
        BreakRound(number, "the driver restarted"),
        Reform(f"round {number} was never saved", True, Cause.DRIVER_RESTART),
    )
    return Decision(actions, line)


def keys_lost(view: JobView, number: int) -> Decision:
    """Round `number`, which this driver took up from an earlier one, waits for rendezvous
    keys that were set on that driver and died with it: its ranks were forming its group, and
    they never will. Break it and re-form. Nothing for another round or a static job."""
    if number != view.round or view.elastic is None or not view.phase.forms_rounds:
        return NOTHING
    line = (
        f"round {number} was forming when the previous driver died, and the keys its ranks "
        "had set went with it: re-forming"
    )
    actions = (
        Log("warning", line),
        BreakRound(number, "the driver restarted while the round formed"),
        Reform(f"round {number}'s rendezvous keys were lost", True, Cause.DRIVER_RESTART),
    )
    return Decision(actions, line)


def stalled(view: JobView, worker_ids: Sequence[str], line: str, now: float) -> Decision:
    """The live workers of `worker_ids` kept the others of their round waiting past
    --stall-timeout (`line` says how): each is killed and has failed (see `failed`), but for
    those taken out with the host of one before them."""
    actions: list[Action] = []
    taken_out: set[str] = set()  # with the host of one of them (--failure-scope host)
    for worker_id in worker_ids:
        worker = view.workers[worker_id]
        if worker.state.alive and worker_id not in taken_out:
            reason = "kept its round waiting past --stall-timeout"
            decision = failed(view, worker, reason, now, end_causes.STALLED)
            taken_out |= {a.worker_id for a in decision.actions if isinstance(a, TakeOut)}
            actions += [Signal(worker_id, kill=True), *decision.actions]
    return Decision(tuple(actions), line) if actions else NOTHING


def stall_seen(
    view: JobView, stall: StallReport, stall_timeout: float | None, now: float
) -> Decision:
    """The current round has a `stall` (see `elastic.driver.observe.stalls.find_stall`):
    past `stall_timeout` (--stall-timeout; None: never) its ranks behind (`stall.missing`)
    kept the others waiting too long and have failed (`stalled`); before that, nothing."""
    if stall_timeout is None or stall.seconds < stall_timeout:
        return NOTHING
    behind = {m.rank for m in stall.missing}
    ids = [worker_id for worker_id, slot in view.slots.items() if slot.rank in behind]
    return stalled(view, ids, stall.line, now)


def durable_stale(worker: Worker, stale: bool, written: int) -> Decision:
    """The worker that writes durable commits says its last write failed (`stale`) or that
    one succeeded again (it says so once per change); `written`: the newest commit it wrote
    (0: none). Training goes on either way: only the words."""
    newest = written or "none"
    if not stale:
        return Decision((Log("info", f"durable commits are written again (newest: {newest})"),), "")
    line = (
        f"the durable copy is stale: worker {worker.worker_id} on {worker.hostname} failed to "
        f"write a durable commit (newest written: {newest}; its log says why); training goes on"
    )
    return Decision((Log("warning", line),), "")
