"""`/v1/stop`: end the job cleanly: every worker is stopped (SIGTERM, then SIGKILL after
--stop-grace) and the launcher exits 0."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import StopResponse

router = APIRouter(prefix="/v1", tags=["job"])


@router.post("/stop")
async def stop(svc: ServicesDep) -> StopResponse:
    if svc.stop_job is None:
        raise HTTPException(503, "this driver cannot stop its job")
    svc.stop_job()
    return StopResponse(message="the job stops: every worker is being stopped")
