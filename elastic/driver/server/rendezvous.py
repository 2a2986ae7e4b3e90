"""`/v1/rendezvous`: a worker joins and learns its slot and epoch."""

from __future__ import annotations

from fastapi import APIRouter

from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import JoinRequest, JoinResponse

router = APIRouter(prefix="/v1/rendezvous", tags=["rendezvous"])


@router.post("/join")
async def join(body: JoinRequest, svc: ServicesDep) -> JoinResponse:
    """Long-poll up to `timeout` seconds for an epoch with a slot for (hostname, local_rank)."""
    joined = await svc.rendezvous.join(body.hostname, body.local_rank, body.timeout)
    if joined is None:
        return JoinResponse(formed=False)
    epoch, slot = joined
    return JoinResponse(formed=True, epoch=epoch, slot=slot)
