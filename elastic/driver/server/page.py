"""`/ui`: the job's live page, its login, and its files (HTML, CSS, JavaScript, no build step).

The page itself holds no data: its script polls `/ui/api/status` (see `page_api.py`). A
stranger gets the login page, which takes a one-time code (`/ui/login?code=...`, the link
`elasticrun status --login` prints, or the launcher on its terminal) or the job token pasted in
a form. Either answers with the "entering" page, which sets the session cookie and carries the
session's page secret to the page's script (`enter.js` keeps it in this origin's local storage,
which no other port of the host can read) and goes on to `/ui`. Only that answer holds the
secret: the cookie alone, which browsers also send to other services on the host, gets no data
(see `require_viewer`). The files are package data in `dashboard/` and are served to anyone:
they hold no data.
"""

from __future__ import annotations

import html
from hmac import compare_digest
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from elastic.driver.server.auth import (
    ServicesDep,
    SessionsDep,
    has_token,
    note_refusal,
    page_session,
)
from elastic.driver.server.sessions import PageSessions
from elastic.protocol.http import Strict

router = APIRouter(prefix="/ui", include_in_schema=False)

FILES = "dashboard"
ASSETS = {"page.js": "text/javascript", "enter.js": "text/javascript", "page.css": "text/css"}
SECURITY_HEADERS = {
    # Only this driver's own files run and load; no frame may hold the page (its buttons).
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a login link's code never leaves in a Referer
    "Cache-Control": "no-store",
}
CODE_REFUSED = (
    "This login link was used already or has expired: a link works once, for 10 minutes. "
    "Get a new one with `elasticrun status --login` (or POST /v1/login-codes with the job "
    "token), or paste the job token below."
)
TOKEN_REFUSED = "That is not the job token."
LOGIN_FORM_FIELDS = 4


class TokenLogin(Strict):
    """The login form's body (`application/x-www-form-urlencoded`: `token=...`)."""

    token: str


def _file(name: str) -> str:
    return resources.files(__package__).joinpath(FILES, name).read_text(encoding="utf-8")


def _html(name: str, status_code: int = 200, **fields: str) -> HTMLResponse:
    """Package file `name`, with each `{{field}}` replaced by its value, HTML-escaped."""
    text = _file(name)
    for field, value in fields.items():
        text = text.replace("{{" + field + "}}", html.escape(value))
    return HTMLResponse(text, status_code, headers=SECURITY_HEADERS)


def login_page(message: str = "", status_code: int = 200) -> HTMLResponse:
    """The login page: the token form, and `message` (why the last try failed) if any."""
    return _html("login.html", status_code, message=message)


def _entering(request: Request, session: str) -> Response:
    """The answer to a login: the entering page with the page secret of the new `session`
    (for `enter.js`), setting the session's cookie: HttpOnly, SameSite=Strict, for `/ui`
    only, Secure over TLS, for as long as the session lasts.

    The way on to `/ui` is the entering page's script, not a 303: a link opened from another
    site (a chat, a mail) makes a cross-site navigation, and a SameSite=Strict cookie is not
    sent along its redirects; a navigation this page starts is a same-site one, so it is."""
    sessions: PageSessions = request.app.state.sessions
    response = _html("enter.html", secret=sessions.page_secret(session))
    response.set_cookie(
        sessions.cookie,
        session,
        max_age=int(sessions.limits.session_lifetime),
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("")
async def page(request: Request) -> HTMLResponse:
    """The page to one logged in (by session or token); the login page to anyone else."""
    if has_token(request) or page_session(request) is not None:
        return _html("index.html")
    return login_page()


@router.get("/login")
async def login_with_code(
    request: Request,
    sessions: SessionsDep,
    code: Annotated[str | None, Query(max_length=256)] = None,
) -> HTMLResponse:
    """With a live one-time `code`: open a session (cookie, page secret) and go on to `/ui`
    (see `_entering`). A used, expired or unknown code gets 401 and the login page saying so;
    no code, the login page."""
    if code is None:
        return login_page()
    session = sessions.redeem(code)
    if session is None:
        note_refusal(request.app.state.refused_peers, _peer(request), "page login code")
        return login_page(CODE_REFUSED, 401)
    return _entering(request, session)


@router.post("/login")
async def login_with_token(request: Request, svc: ServicesDep, sessions: SessionsDep) -> Response:
    """The login form: the job token opens a session (cookie, page secret) and goes on to
    `/ui` (see `_entering`); a wrong one gets 401 and the login page saying so."""
    body = (await request.body()).decode("utf-8", "replace")
    try:
        fields = parse_qs(body, max_num_fields=LOGIN_FORM_FIELDS)
        form = TokenLogin(token=fields.get("token", [""])[0])
    except (ValueError, ValidationError) as error:
        raise HTTPException(400, "the login form sends one field, token") from error
    if not compare_digest(form.token.encode(), svc.token.encode()):
        note_refusal(request.app.state.refused_peers, _peer(request), "page login")
        return login_page(TOKEN_REFUSED, 401)
    return _entering(request, sessions.open_session())


@router.get("/assets/{name}")
async def asset(name: str) -> Response:
    """The page's script and style sheet (no data in them: served to anyone)."""
    if name not in ASSETS:
        raise HTTPException(404, "no such file")
    return Response(_file(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


def _peer(request: Request) -> str:
    return request.client.host if request.client else "unknown"
