"""Which host to cut off when members of a round cannot reach each other. Pure, no I/O.

A host cut off from its peers but not from the driver keeps heartbeating, so liveness never
judges it; its peers' collectives block on it until the collective timeout. Members blocked
in a collective probe their peers (`elastic.worker.group.reachability`) and report the ranks that
do not answer. After the reports of a round have had time to arrive, the host that the most
other hosts cannot reach is cut off: its workers have failed, as if they had died.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from elastic.driver.policy import end_causes
from elastic.driver.policy.actions import NOTHING, Decision, Signal
from elastic.driver.policy.view import JobView
from elastic.driver.policy.worker_events import failed

Reports = Mapping[str, Set[int]]
"""Per reporting worker id, the ranks of the round it found unreachable."""


def cut_off(view: JobView, number: int, reports: Reports, now: float) -> Decision:
    """The decision once round `number`'s unreachability `reports` are in.

    Each other host that reports a host unreachable (any of its ranks) counts one vote
    against it; reports about ranks of the reporter's own host do not count. The host with
    the most votes is cut off; between equals, the one that itself reports the most other
    hosts unreachable (a host cut off from all its peers reports every one, while a report
    of one of its peers may come late), then the one holding the highest rank (the newest in
    the job) goes, so that two hosts that cannot reach each other keep the older one. Its
    live members are killed and have failed (cooldown, broken round, re-form). Nothing is
    done for an older round, a job that forms no rounds, or reports naming no other host.
    """
    if number != view.round or view.elastic is None or not view.phase.forms_rounds:
        return NOTHING
    host_of_rank = {slot.rank: view.workers[w].hostname for w, slot in view.slots.items()}
    votes: dict[str, set[str]] = {}
    for reporter_id, ranks in reports.items():
        reporter = view.workers.get(reporter_id)
        if reporter is None or reporter_id not in view.slots:
            continue
        for rank in ranks:
            host = host_of_rank.get(rank)
            if host is not None and host != reporter.hostname:
                votes.setdefault(host, set()).add(reporter.hostname)
    if not votes:
        return NOTHING
    highest_rank = {host: rank for rank, host in sorted(host_of_rank.items())}
    reported_by: dict[str, set[str]] = {}  # host -> the other hosts it reports
    for host, voters in votes.items():
        for voter in voters:
            reported_by.setdefault(voter, set()).add(host)
    loser = max(
        votes,
        key=lambda h: (len(votes[h]), len(reported_by.get(h, ())), highest_rank[h]),
    )
    voters = ", ".join(sorted(votes[loser]))
    reason = f"is unreachable from its peers on host(s) {voters}"
    actions = []
    for worker_id in view.slots:
        worker = view.workers[worker_id]
        if worker.hostname == loser and worker.state.alive:
            decision = failed(view, worker, reason, now, end_causes.UNREACHABLE)
            actions += [Signal(worker_id, kill=True), *decision.actions]
    line = f"host {loser} is unreachable from its peers on host(s) {voters}: cutting it off"
    return Decision(tuple(actions), line)
