"""`/v1/hosts/{hostname}/drain`: an operator takes a host out of the job (POST) or gives it
back (DELETE). A drained host's workers leave at their next step boundary, as on a
preemption notice, and it gets no new ones until it is undrained."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Path

from elastic.driver.server.auth import ServicesDep
from elastic.protocol.http import MAX_KEY_LENGTH, DrainResponse, ErrorResponse

router = APIRouter(prefix="/v1/hosts", tags=["hosts"])
HostName = Path(min_length=1, max_length=MAX_KEY_LENGTH)
ANSWERS = {404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}}


def _set(svc: ServicesDep, hostname: str, drained: bool) -> DrainResponse:
    if svc.set_drained is None:
        raise HTTPException(503, "this driver cannot drain hosts")
    try:
        message = svc.set_drained(hostname, drained)
    except LookupError as err:
        raise HTTPException(404, str(err)) from None
    except ValueError as err:
        raise HTTPException(409, str(err)) from None
    return DrainResponse(hostname=hostname, drained=drained, message=message)


@router.post("/{hostname}/drain", responses=ANSWERS)
async def drain(svc: ServicesDep, hostname: str = HostName) -> DrainResponse:
    return _set(svc, hostname, True)


@router.delete("/{hostname}/drain", responses=ANSWERS)
async def undrain(svc: ServicesDep, hostname: str = HostName) -> DrainResponse:
    return _set(svc, hostname, False)
