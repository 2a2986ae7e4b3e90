"""`/v1/login-codes`: a new one-time login link to the page, for a caller with the job token
(`elasticrun status` can print one; the driver logs the first at start)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from elastic.driver.server.auth import SessionsDep
from elastic.protocol.http import LoginCode

router = APIRouter(prefix="/v1", tags=["page"])

LOGIN_PATH = "/ui/login"


def driver_url(request: Request) -> str:
    """This driver's URL as the request reached it: the scheme and the socket's own address
    (not the Host header, which the peer writes)."""
    host, port = request.scope.get("server") or (None, None)
    if host is None or port is None:  # not over a socket (an in-process test's client)
        return str(request.base_url).rstrip("/")
    host = f"[{host}]" if ":" in host else host
    return f"{request.url.scheme}://{host}:{port}"


def login_url(api_url: str, code: str) -> str:
    """The page's login link for `code` on the driver at `api_url`."""
    return f"{api_url}{LOGIN_PATH}?code={code}"


@router.post("/login-codes", status_code=201)
async def mint_login_code(request: Request, sessions: SessionsDep) -> LoginCode:
    """A login link that opens one page session, once, within `expires_in` seconds."""
    code = sessions.mint_code()
    return LoginCode(
        url=login_url(driver_url(request), code), expires_in=sessions.limits.code_lifetime
    )
