"""What a change of the offered hosts means for their workers: removed, drained, noticed or
shrunk hosts' workers leave the job at a commit (no rollback, no cooldown). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from elastic.driver.discovery.tracker import HostChange
from elastic.driver.policy.actions import (
    NOTHING,
    Action,
    AskToLeave,
    Decision,
    Drain,
    FillSlots,
    Log,
    SeeHandovers,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.view import JobView


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


def hosts_changed(
    view: JobView,
    change: HostChange,
    offered: Set[str],
    noticed: Mapping[str, float],
    drained: Set[str],
) -> Decision:
    """Discovery or a cooldown changed the usable hosts (`change`). `offered`: the hosts
    discovery offers now; `noticed`: those of them about to go (hostname -> when, on the
    driver's clock); `drained`: those an operator drained.

    Workers on a removed host leave unless discovery still offers it (a host merely in
    cooldown keeps its live workers); one noticed or drained counts as not offered
    (`hosts_removed`). Workers beyond a shrunk host's new count leave (`hosts_resized`).
    Added hosts are said; free slots are filled last, once the leavers are asked."""
    discovered = set(offered) - noticed.keys() - drained
    removed = hosts_removed(view, change.removed, discovered, noticed, drained)
    sizes = {h.hostname: h.slots for h in change.hosts}
    resized = hosts_resized(view, {name: sizes[name] for name in change.resized})
    added = ", ".join(change.added)
    said = (Log("info", f"hosts available: {added}", "join"),) if change.added else ()
    reason = "; ".join(r for r in (removed.reason, resized.reason) if r)
    return Decision((*removed.actions, *resized.actions, *said, FillSlots()), reason)


def drain_asked(
    view: JobView, hostname: str, drained: bool, was_drained: bool, cooling: bool
) -> Decision:
    """An operator drained `hostname` (`drained`) or undrained it; `was_drained`: whether it
    was drained already (then nothing changes); `cooling`: whether it is in cooldown now.

    A drained host gets no new workers (`Drain`), and its workers leave at their next step:
    through the change of usable hosts that the drain brings about (`hosts_changed`), or, for
    a host in cooldown, which was not usable and so brings no change, here and now. An
    undrained host's free slots are filled again (by that change)."""
    if drained == was_drained:
        return NOTHING
    if not drained:
        line = f"host {hostname} is undrained: its free slots are filled again"
        return Decision((Log("info", line), Drain(hostname, False)), "")
    line = (
        f"host {hostname} is drained (elasticrun drain): its workers leave at their next "
        f"step, and it gets no new ones until `elasticrun undrain {hostname}`"
    )
    said = (Log("warning", line, "leave"), Drain(hostname, True))
    if not cooling:
        return Decision(said, "")  # the host change it brings about decides, with its reason
    leave = hosts_removed(view, [hostname], set(), {}, frozenset({hostname}))
    return Decision((*said, *leave.actions), leave.reason)
