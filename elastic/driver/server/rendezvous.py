"""`/v1/rendezvous`: a worker joins the next round and learns its slot (the body's `epoch`
fields are rounds: the worker protocol keeps their first name)."""

from __future__ import annotations

from fastapi import APIRouter

from elastic.driver.rendezvous.membership import NotMemberError
from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import JoinRequest, JoinResponse

router = APIRouter(prefix="/v1/rendezvous", tags=["rendezvous"])


@router.post("/join")
async def join(body: JoinRequest, svc: ServicesDep) -> JoinResponse:
    """Long-poll up to `timeout` seconds for a round newer than `after_epoch` with the worker."""
    try:
        joined = await svc.rendezvous.join(
            body.worker_id, body.after_epoch, body.timeout, body.commit
        )
    except NotMemberError:
        return JoinResponse(status="not_member")
    if joined is None:
        return JoinResponse(status="pending")
    if svc.durable is not None:
        await svc.durable()
    return JoinResponse(
        status="formed", epoch=joined.round, slot=joined.slot, job_commit=svc.newest_commit()
    )
