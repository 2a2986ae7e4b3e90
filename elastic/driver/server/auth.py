"""The one authentication check: a route dependency, and the same check at the ASGI door.

`TokenGate` refuses a request without the job token from its headers alone, before its body
is read, so each request of a flood of unauthenticated ones costs the driver a header lookup
and a ~100-byte answer, however large its body, and none of them waits in line for anything.
`require_token` stays on every route, so a route is guarded even where the gate is absent.
"""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.types import ASGIApp, Receive, Scope, Send

from elastic.driver.server.limits import refusal
from elastic.driver.server.services import Services
from elastic.protocol.env import AUTH_SCHEME

log = logging.getLogger(__name__)

UNAUTHORIZED = "missing or wrong job token"
MAX_LOGGED_PEERS = 1024  # distinct refused peers remembered; later ones are not logged


def _services_of(request: Request) -> Services:
    return request.app.state.services


async def services(request: Request) -> Services:
    """The driver's services for a route. `async def` like every per-request dependency
    here: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request
    (and a wait for a free thread, 40 at most, under thousands of joins) for a dict lookup."""
    return _services_of(request)


ServicesDep = Annotated[Services, Depends(services)]


def token_matches(authorization: bytes, token: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <token>`; constant time in the
    token's content."""
    scheme, _, given = authorization.partition(b" ")
    return scheme == AUTH_SCHEME.encode() and hmac.compare_digest(given, token.encode())


def note_refusal(refused: set[str], peer: str, what: str = "HTTP request") -> None:
    """Log a peer refused for a wrong or missing token (`what` it sent: "HTTP request") the
    first time only, and at most `MAX_LOGGED_PEERS` of them."""
    if peer in refused or len(refused) > MAX_LOGGED_PEERS:
        return
    refused.add(peer)
    if len(refused) > MAX_LOGGED_PEERS:
        log.warning("refused unauthenticated %ss from many peers; no longer logging", what)
    else:
        log.warning("refused an unauthenticated %s from %s", what, peer)


async def require_token(request: Request) -> None:
    """Raise 401 unless the request carries `Authorization: Bearer <job token>`.

    The comparison takes constant time; a refused peer is logged once. Runs on the event
    loop (no thread pool): it only reads a header and compares.
    """
    given = request.headers.get("authorization", "").encode("latin-1")
    if token_matches(given, _services_of(request).token):
        return
    note_refusal(
        request.app.state.refused_peers, request.client.host if request.client else "unknown"
    )
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, UNAUTHORIZED, headers={"WWW-Authenticate": AUTH_SCHEME}
    )


class TokenGate:
    """Pure ASGI middleware: answers 401 (`WWW-Authenticate: Bearer`, connection closed) to an
    HTTP request without the job token, before reading any of its body, unless its path is
    one of `open_paths` (served to anyone: nothing secret there).

    The token and the set of refused peers are read from the Starlette app serving the
    request (`app.state.services`, `app.state.refused_peers`), as `require_token` reads them.
    """

    def __init__(self, app: ASGIApp, open_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            state = scope["app"].state
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not token_matches(given, state.services.token):
                client = scope.get("client")
                note_refusal(state.refused_peers, client[0] if client else "unknown")
                answer = refusal(401, UNAUTHORIZED, {"WWW-Authenticate": AUTH_SCHEME})
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)
