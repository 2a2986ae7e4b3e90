"""`/ui/api`: what the page reads and the buttons it has, for a page session or the token.

Every route, a read or a button, needs the token or a page session with its page secret in
the `X-Elasticrun-Page` header (`require_viewer`, see `auth.py`): the session cookie alone,
which browsers also send to other services on the same host, gets 403. The buttons do what
`elasticrun drain`, `undrain` and `stop` do, through the same `/v1` route code (`host_drain.py`,
`stop.py`), with the same answers and errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from elastic.driver.server import host_drain, stop
from elastic.driver.server.auth import ServicesDep, SessionsDep, page_session, require_viewer
from elastic.protocol.http import MAX_KEY_LENGTH, DrainResponse, JobStatus, StopResponse, Strict

router = APIRouter(
    prefix="/ui/api", include_in_schema=False, dependencies=[Depends(require_viewer)]
)

Hostname = Annotated[str, Path(min_length=1, max_length=MAX_KEY_LENGTH)]
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
    """A line the page shows (the answer to logging out)."""

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
async def drain(hostname: Hostname, svc: ServicesDep) -> DrainResponse:
    """Drain `hostname`, as `POST /v1/hosts/{hostname}/drain` does (the same answers)."""
    return await host_drain.drain(svc, hostname)


@router.delete("/hosts/{hostname}/drain")
async def undrain(hostname: Hostname, svc: ServicesDep) -> DrainResponse:
    """Undrain `hostname`, as `DELETE /v1/hosts/{hostname}/drain` does."""
    return await host_drain.undrain(svc, hostname)


@router.post("/stop")
async def stop_job(svc: ServicesDep) -> StopResponse:
    """End the job cleanly, as `POST /v1/stop` does."""
    return await stop.stop(svc)


@router.post("/logout")
async def logout(request: Request, sessions: SessionsDep, response: Response) -> PageAnswer:
    """End this page session and forget its cookie (a token-only caller has none)."""
    if (session := page_session(request)) is not None:
        sessions.close(session)
    response.delete_cookie(sessions.cookie, path="/ui", httponly=True, samesite="strict")
    return PageAnswer(message="logged out")
