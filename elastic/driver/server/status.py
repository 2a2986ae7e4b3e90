"""`/v1/status`: the job as the driver sees it (never contains the token)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter

from elastic.driver.policy.end_causes import end_cause
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.server.auth import ServicesDep
from elastic.driver.worker_history import EndedCounts
from elastic.driver.workers import Worker
from elastic.protocol.http import (
    DecisionRecord,
    DriverUrls,
    DurableStatus,
    HostStatus,
    JobStatus,
    RoundRecord,
    StallReport,
    WorkerStatus,
)

router = APIRouter(prefix="/v1", tags=["status"])


@router.get("/status")
async def job_status(svc: ServicesDep) -> JobStatus:
    return svc.status()


def describe_job(
    job_id: str,
    rendezvous: Rendezvous,
    workers: Iterable[Worker],
    hosts: Iterable[HostStatus],
    decisions: Iterable[DecisionRecord],
    checkpoint_dir: str = "",
    *,
    now: float = 0.0,
    rounds: Iterable[RoundRecord] = (),
    stall: StallReport | None = None,
    urls: DriverUrls | None = None,
    log_tail: Iterable[str] = (),
    ended: EndedCounts | None = None,
) -> JobStatus:
    """The status of job `job_id`: its round, its usable `hosts`, the `workers` the driver
    keeps records of (live ones and the newest ended ones: rank and local rank in the current
    round, if a member; a live one's progress, with ages as of `now` on the driver's
    monotonic clock; an ended one's cause), every ended worker counted (`ended`, dropped
    records' counts included; default: those of `workers`), its newest `decisions`, its
    `rounds` and `stall`, the launcher's newest lines (`log_tail`, oldest first), and its
    durable commits when there is a `checkpoint_dir` or a worker wrote one (a state given its
    own directory)."""
    statuses = []
    workers = list(workers)
    newest = max((w.durable for w in workers), default=0)
    stale = any(w.durable_stale for w in workers if w.state.alive)
    durable = (
        DurableStatus(newest=newest, stale=stale) if checkpoint_dir or newest or stale else None
    )
    for worker in workers:
        slot = rendezvous.slot_of(worker.worker_id)
        statuses.append(
            WorkerStatus(
                worker_id=worker.worker_id,
                rank=slot.rank if slot is not None else None,
                hostname=worker.hostname,
                local_rank=slot.local_rank if slot is not None else None,
                state=worker.state.value,
                pid=worker.pid,
                exit_code=worker.exit_code,
                commit=worker.commit,
                end_cause=None if worker.state.alive else end_cause(worker),
                **_progress(worker, rendezvous.round, now),
            )
        )
    counts = ended if ended is not None else EndedCounts().plus(workers)
    return JobStatus(
        job_id=job_id,
        round=rendezvous.round,
        size=len(rendezvous.members),
        hosts=list(hosts),
        workers=statuses,
        ended_total=counts.total,
        ended_by_state=dict(counts.by_state),
        ended_by_cause=dict(counts.by_cause),
        decisions=list(decisions),
        durable=durable,
        rounds=list(rounds),
        stall=stall,
        urls=urls,
        log_tail=list(log_tail),
    )


def _progress(worker: Worker, current_round: int, now: float) -> dict[str, Any]:
    """A live worker's progress fields of its `WorkerStatus` (none for an ended one)."""
    progress, activity = worker.progress, worker.progress.activity
    if not worker.state.alive or activity is None:
        return {}
    return {
        "steps": activity.steps,
        "step_rate": progress.step_rate,
        "sample_rate": progress.sample_rate,
        "commit_age": progress.age(activity.commit_age, now),
        "durable_age": progress.age(activity.durable_age, now),
        "heartbeat_age": max(0.0, now - worker.last_heartbeat),
        "collective": progress.collective(now) if progress.round == current_round else None,
    }
