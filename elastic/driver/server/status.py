"""`/v1/status`: the job as the driver sees it (never contains the token)."""

from __future__ import annotations

from fastapi import APIRouter

from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import JobStatus

router = APIRouter(prefix="/v1", tags=["status"])


@router.get("/status")
async def job_status(svc: ServicesDep) -> JobStatus:
    return svc.status()
