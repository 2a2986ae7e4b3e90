"""When to form the next round and with whom, when to fill free slots, when the job ends. Pure.

The next round keeps the current round's survivors in rank order and appends the joiners
waiting at the rendezvous, up to --max-np; below --min-np the job waits (SHORT) and fills free
slots, past --elastic-timeout or --reset-limit it ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.policy.actions import (
    NOTHING,
    Decision,
    FillSlots,
    Finish,
    FormRound,
    Launch,
    Log,
    ShowProgress,
    WaitForWorkers,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.planning import free_slots, next_members
from elastic.driver.policy.view import JobView
from elastic.driver.workers import WorkerState

JOIN_WINDOW = 3.0  # seconds ready joiners wait for those launched with them before a round
REASONS_SHOWN = 3  # a round wanted for more reasons names this many and counts the rest


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
    return Decision((FormRound(tuple(members), why, cause),), why)


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


def summarize(reasons: Sequence[str]) -> str:
    """One line for the reasons a round was wanted for, in order, each once."""
    distinct = list(dict.fromkeys(reasons))
    if len(distinct) <= REASONS_SHOWN:
        return "; ".join(distinct)
    shown = "; ".join(distinct[: REASONS_SHOWN - 1])
    return f"{shown}; and {len(distinct) - REASONS_SHOWN + 1} more"
