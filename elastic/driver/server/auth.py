"""Who may ask what: the job token for the API, a page session (or the token) for the page.

Three doors, one place (`TokenGate`, at the ASGI door, from the headers alone):
* `/metrics` (the lead's Prometheus route, `open_paths`): anyone; it holds nothing secret;
* the page, `/ui...`: its JSON routes (`/ui/api/...`) need the token or a live page session
  (the cookie that `/ui/login` sets, see `sessions.py`), and with the session its page secret
  (checked by `require_viewer`, not here); its HTML routes let anyone through to
  their route, which shows the login page to a stranger (no data), with a body of at most
  `LOGIN_BODY_BYTES`;
* everything else (`/v1/...`): the job token, `Authorization: Bearer <token>`.

A request let through without the token or a session (to `/metrics`, the login page, its
files) may send a body of at most `LOGIN_BODY_BYTES`, and must be read and answered within the
connection's idle timeout (`connections.py`, which also closes it first for room). A refused
request is refused before its body is read, so each request of a flood of
unauthenticated ones costs the driver a header lookup and a ~100-byte answer, however large its
body, and none of them waits in line for anything. The route dependencies (`require_token`,
`require_viewer`) repeat the check on every route, so a route is guarded even where the gate is
absent.
"""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from elastic.driver.server.limits import BodyLimit, refusal
from elastic.driver.server.services import Services
from elastic.driver.server.sessions import PageSessions
from elastic.protocol.env import AUTH_SCHEME

log = logging.getLogger(__name__)

UNAUTHORIZED = "missing or wrong job token"
UNAUTHORIZED_PAGE = (
    "log in first: open a login link (elasticrun status --login prints one), or send the job token"
)
PAGE_SECRET_NEEDED = (
    "refused: with the page's session cookie, a request must carry the page secret of that "
    "session in its X-Elasticrun-Page header (the page got it at login; the cookie alone, "
    "which browsers also send to other services on this host, is not enough); log in again "
    "with a new link: elasticrun status --login"
)
MAX_LOGGED_PEERS = 1024  # distinct refused peers remembered; later ones are not logged
PAGE = "/ui"
PAGE_API = "/ui/api/"
PAGE_MARKER = "x-elasticrun-page"
"""The header that carries the page secret of the session (`PageSessions.page_secret`) on every
request of the page to `/ui/api/...`: a cross-site form cannot set a header, a script of
another origin that sets one needs a CORS preflight this driver never grants, and a service on
another port of this host that received the cookie does not know the secret."""
LOGIN_BODY_BYTES = 4096  # the most a request without a login may send (the page, /metrics)


def _services_of(request: Request) -> Services:
    return request.app.state.services


async def services(request: Request) -> Services:
    """The driver's services for a route. `async def` like every per-request dependency
    here: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request
    (and a wait for a free thread, 40 at most, under thousands of joins) for a dict lookup."""
    return _services_of(request)


ServicesDep = Annotated[Services, Depends(services)]


async def page_sessions(request: Request) -> PageSessions:
    """The page's login codes and sessions, owned by the app (`app.state.sessions`)."""
    return request.app.state.sessions


SessionsDep = Annotated[PageSessions, Depends(page_sessions)]


def token_matches(authorization: bytes, token: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <token>`; constant time in the
    token's content."""
    scheme, _, given = authorization.partition(b" ")
    return scheme == AUTH_SCHEME.encode() and hmac.compare_digest(given, token.encode())


def is_page(path: str) -> bool:
    """Whether `path` is one of the page's (`/ui` and below)."""
    return path == PAGE or path.startswith(PAGE + "/")


def session_cookie(cookie_header: str, sessions: PageSessions) -> str | None:
    """The page session named by a `Cookie` header, if it names a live one."""
    session = cookie_parser(cookie_header).get(sessions.cookie)
    return session if sessions.is_session(session) else None


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


def _refuse(request: Request, detail: str) -> HTTPException:
    note_refusal(
        request.app.state.refused_peers, request.client.host if request.client else "unknown"
    )
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": AUTH_SCHEME}
    )


async def require_token(request: Request) -> None:
    """Raise 401 unless the request carries `Authorization: Bearer <job token>`.

    The comparison takes constant time; a refused peer is logged once. Runs on the event
    loop (no thread pool): it only reads a header and compares.
    """
    given = request.headers.get("authorization", "").encode("latin-1")
    if not token_matches(given, _services_of(request).token):
        raise _refuse(request, UNAUTHORIZED)


def has_token(request: Request) -> bool:
    """Whether the request carries the job token (no refusal noted)."""
    given = request.headers.get("authorization", "").encode("latin-1")
    return token_matches(given, _services_of(request).token)


def page_session(request: Request) -> str | None:
    """The live page session the request's cookie names, if any."""
    return session_cookie(request.headers.get("cookie", ""), request.app.state.sessions)


async def require_viewer(request: Request) -> None:
    """Raise unless the request may use the page's JSON routes (`/ui/api/...`), reads and
    buttons alike: 401 without the job token or a live page session; 403 for a session
    whose request does not carry that session's page secret in `X-Elasticrun-Page`
    (`PAGE_SECRET_NEEDED`): a cookie replayed by another service of this host, or a form of
    another site. A request with the token needs no secret: a browser never adds the token.
    The secret is compared in constant time."""
    if has_token(request):
        return
    if (session := page_session(request)) is None:
        raise _refuse(request, UNAUTHORIZED_PAGE)
    given = request.headers.get(PAGE_MARKER, "")
    if not request.app.state.sessions.is_page_secret(session, given):
        raise HTTPException(status.HTTP_403_FORBIDDEN, PAGE_SECRET_NEEDED)


def identified(state: object, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request's lower-case `headers` carry the job token or name a live page
    session of the app whose `state` is given (False for an app without a token). The
    connection limits read it from a request's head, before the app runs (`connections.py`)."""
    services: Services | None = getattr(state, "services", None)
    if services is None:
        return False
    first = {}  # each header's first value, as `TokenGate` reads it
    for name, value in headers:
        first.setdefault(name, value)
    if token_matches(first.get(b"authorization", b""), services.token):
        return True
    cookie = first.get(b"cookie", b"").decode("latin-1")
    sessions: PageSessions = state.sessions  # type: ignore[attr-defined]
    return bool(cookie) and session_cookie(cookie, sessions) is not None


class TokenGate:
    """Pure ASGI middleware, the doors of this module's docstring: answers 401
    (`WWW-Authenticate: Bearer`, connection closed) to a request that its path's door refuses,
    before reading any of its body. `open_paths` are served to anyone (nothing secret there),
    with a body of at most `LOGIN_BODY_BYTES`, as the login page is.

    The token, the page's sessions and the set of refused peers are read from the Starlette
    app serving the request (`app.state.services`, `.sessions`, `.refused_peers`), as the route
    dependencies read them.
    """

    def __init__(self, app: ASGIApp, open_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.open_paths = open_paths
        self._login_sized = BodyLimit(app, LOGIN_BODY_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        if token_matches(_header(scope, b"authorization"), state.services.token):
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.open_paths:
            await self._login_sized(scope, receive, send)
            return
        path = scope["path"]
        if is_page(path):
            cookie = _header(scope, b"cookie").decode("latin-1")
            if session_cookie(cookie, state.sessions) is not None:
                await self.app(scope, receive, send)
                return
            if not path.startswith(PAGE_API):  # the login page, its assets: no data
                await self._login_sized(scope, receive, send)
                return
        client = scope.get("client")
        note_refusal(state.refused_peers, client[0] if client else "unknown")
        detail = UNAUTHORIZED_PAGE if is_page(path) else UNAUTHORIZED
        answer = refusal(401, detail, {"WWW-Authenticate": AUTH_SCHEME})
        await answer(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes:
    """The first value of header `name` (lower case), as Starlette's `headers.get` reads it."""
    return next((v for k, v in scope["headers"] if k == name), b"")
