"""What a change of the offered hosts means for their workers: removed, drained, noticed or
shrunk hosts' workers leave the job at a commit (no rollback, no cooldown). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from elastic.driver.policy.actions import NOTHING, Action, AskToLeave, Decision, SeeHandovers
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
