"""`/v1/status`: the job as the driver sees it (never contains the token)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.rendezvous.rounds import Rendezvous
from elastic.driver.server.auth import ServicesDep
from elastic.driver.workers import Worker
from elastic.protocol.http import (
    DecisionRecord,
    DurableStatus,
    HostStatus,
    JobStatus,
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
    hosts: Iterable[HostSpec],
    decisions: Iterable[DecisionRecord],
    checkpoint_dir: str = "",
) -> JobStatus:
    """The status of job `job_id`: its round, its usable `hosts`, every worker launched (rank
    and local rank in the current round, if a member), its newest `decisions`, and its
    durable commits when there is a `checkpoint_dir` or a worker wrote one (a state given
    its own directory)."""
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
            )
        )
    return JobStatus(
        job_id=job_id,
        epoch=rendezvous.epoch,
        size=len(rendezvous.members),
        hosts=[HostStatus(hostname=h.hostname, slots=h.slots) for h in hosts],
        workers=statuses,
        decisions=list(decisions),
        durable=durable,
    )
