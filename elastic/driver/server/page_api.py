"""`/ui/api`: what the page reads and the buttons it has, for a page session or the token.

Every route needs a login (`require_viewer`); one that changes the job needs the page's own
header as well, when the login is the session cookie (see `auth.py`). The buttons call the
same `Services.set_drained` and `Services.stop_job` as `elasticrun drain`, `undrain` and
`stop`; a driver without them answers 503 with one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response

from elastic.driver.server.auth import ServicesDep, SessionsDep, page_session, require_viewer
from elastic.driver.server.services import Services
from elastic.protocol.http import JobStatus, Strict

router = APIRouter(
    prefix="/ui/api", include_in_schema=False, dependencies=[Depends(require_viewer)]
)

Hostname = Annotated[str, Path(min_length=1, max_length=255)]
STATUS_MAX_AGE = 0.5  # seconds one answer to the page's poll is served again to every page


class SharedStatus:
    """The job's status as JSON, built at most once per `max_age` seconds whatever the number
    of open pages: at 10,000 workers building and encoding it holds the driver's event loop
    for tens of milliseconds, and each page asks every second. `clock` is monotonic."""

    def __init__(
        self, max_age: float = STATUS_MAX_AGE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age, self._clock = max_age, clock
        self._built_at = float("-inf")
        self._json = b""

    def json(self, status: Callable[[], JobStatus]) -> bytes:
        """`status()` encoded, or the encoding made less than `max_age` seconds ago."""
        now = self._clock()
        if now - self._built_at >= self.max_age:
            self._json, self._built_at = status().model_dump_json().encode(), now
        return self._json


class PageAnswer(Strict):
    """What a button did, in the line the page shows."""

    message: str


@router.get("/status", response_class=Response)
async def page_status(request: Request, svc: ServicesDep) -> Response:
    """The job's status, as `/v1/status` answers it, at most `STATUS_MAX_AGE` seconds old
    (the page polls this every second)."""
    shared: SharedStatus = request.app.state.page_status
    return Response(
        shared.json(svc.status),
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


@router.post("/hosts/{hostname}/drain")
async def drain(hostname: Hostname, svc: ServicesDep) -> PageAnswer:
    """Drain `hostname`: its workers leave at their next step; it gets no new ones."""
    _set_drained(svc, hostname, True)
    return PageAnswer(message=f"host {hostname} is drained: its workers leave at their next step")


@router.delete("/hosts/{hostname}/drain")
async def undrain(hostname: Hostname, svc: ServicesDep) -> PageAnswer:
    """Undrain `hostname`: its free slots get workers again."""
    _set_drained(svc, hostname, False)
    return PageAnswer(message=f"host {hostname} is undrained: its free slots get workers again")


@router.post("/stop")
async def stop(svc: ServicesDep) -> PageAnswer:
    """End the job cleanly: every worker is stopped and the launcher exits."""
    if svc.stop_job is None:
        raise HTTPException(503, "this driver cannot stop its job from the page")
    job_id = svc.status().job_id
    svc.stop_job()
    return PageAnswer(message=f"job {job_id} is stopping: every worker is stopped")


@router.post("/logout")
async def logout(request: Request, sessions: SessionsDep, response: Response) -> PageAnswer:
    """End this page session and forget its cookie (a token-only caller has none)."""
    if (session := page_session(request)) is not None:
        sessions.close(session)
    response.delete_cookie(sessions.cookie, path="/ui", httponly=True, samesite="strict")
    return PageAnswer(message="logged out")


def _set_drained(svc: Services, hostname: str, drained: bool) -> None:
    """Ask the driver; 503 when it cannot drain, 404 when the job knows no such host."""
    if svc.set_drained is None:
        raise HTTPException(
            503, "this job cannot drain hosts (only an elastic job can: --min-np or discovery)"
        )
    if not svc.set_drained(hostname, drained):
        status = svc.status()
        known = ", ".join(h.hostname for h in status.hosts) or "none"
        raise HTTPException(404, f"job {status.job_id} has no host {hostname} (hosts: {known})")
