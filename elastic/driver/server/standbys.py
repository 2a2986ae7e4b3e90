"""`/v1/standby`: a warm standby waits for a worker's slot (see `launch/standbys.py`)."""

from __future__ import annotations

from fastapi import APIRouter

from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import StandbyAnswer, StandbyWaitRequest

router = APIRouter(prefix="/v1/standby", tags=["standby"])


@router.post("/wait")
async def wait(body: StandbyWaitRequest, svc: ServicesDep) -> StandbyAnswer:
    """Long-poll up to `timeout` seconds for a slot: `run` with the worker's environment,
    `pending`, or `exit` (this driver does not want the standby)."""
    if svc.standby_wait is None:
        return StandbyAnswer(status="exit")
    return await svc.standby_wait(body.standby_id, body.timeout)
