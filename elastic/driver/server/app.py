"""Builds the FastAPI app and serves it with uvicorn inside the driver's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from elastic.driver.launch.network import own_names
from elastic.driver.server import (
    host_drain,
    kv,
    login_codes,
    metrics,
    page,
    page_api,
    rendezvous,
    standbys,
    status,
    stop,
)
from elastic.driver.server.auth import TokenGate, identified, require_token
from elastic.driver.server.connections import ConnectionGuard, ConnectionLimits
from elastic.driver.server.host_check import AllowedHosts, HostCheck
from elastic.driver.server.limits import MAX_BODY_BYTES, BodyLimit
from elastic.driver.server.services import Services
from elastic.driver.server.sessions import PageSessions
from elastic.driver.server.tls import TlsIdentity
from elastic.protocol.http import ErrorResponse

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 1  # seconds requests in progress get when the server stops


class _AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a field name in a 422 answer comes from the
    peer and may hold lone surrogates, which UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False).encode()


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Where and why a body was refused, without echoing the offending input back (it may be
    megabytes long, NaN, or not encodable)."""
    return [{k: e[k] for k in ("loc", "msg", "type") if k in e} for e in exc.errors()]


def create_app(
    services: Services,
    max_body_bytes: int = MAX_BODY_BYTES,
    sessions: PageSessions | None = None,
) -> FastAPI:
    """The HTTP API (`/v1`: the job token), the page (`/ui`: a page session from `sessions`, or
    the token) and `/metrics` (read-only, no secret: open).

    A request refused for its login is refused (401) from its headers, before its body is
    read; a body over `max_body_bytes` is refused (413) before it is parsed (see `TokenGate`,
    `BodyLimit`).
    """
    app = FastAPI(
        title="elasticrun driver",
        version="1",
        responses={
            401: {"model": ErrorResponse},
            413: {"model": ErrorResponse, "description": "request body too large"},
            422: {"description": "malformed request"},
        },
    )
    app.state.services = services
    app.state.sessions = sessions or PageSessions()
    app.state.page_status = page_api.SharedStatus()
    app.state.refused_peers = set()
    # The API: the token.
    for module in (rendezvous, kv, status, host_drain, stop, login_codes, standbys):
        app.include_router(module.router, dependencies=[Depends(require_token)])
    app.include_router(page.router)  # its own login: see page.py
    app.include_router(page_api.router)  # a page session or the token: see page_api.py
    app.include_router(metrics.router)  # open: the gate's open_paths
    # The last middleware added runs first: the login is checked before the body is counted.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(TokenGate, open_paths=frozenset({metrics.PATH}))

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _AsciiJSONResponse({"detail": _validation_errors(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("error serving %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"driver error: {type(exc).__name__}"}, status_code=503)

    return app


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the driver owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """uvicorn on an already-bound socket, so the port is known before workers launch.

    With `tls` it serves HTTPS only (a plain-HTTP client fails its request) and `url` starts
    with https://; the SSLContext is built here, so a bad identity raises before serving.
    Connections are bounded in number and in idle time by `limits` (see `ConnectionGuard`;
    default: `ConnectionLimits()`); a request carrying `app.state.services.token` or a live
    page session is timed by its route, any other by the limits. Every request must name this
    server in its Host header: the bound address, loopback names when that is loopback, the
    machine's names, or one of `allowed_hosts` (`--allowed-hosts`; see `HostCheck`), else it
    gets 421. Raises ValueError for a bad entry of `allowed_hosts`.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int = 0,
        tls: TlsIdentity | None = None,
        limits: ConnectionLimits | None = None,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self._allowed_hosts = tuple(allowed_hosts)
        # Without the machine's names until `start` looks them up (DNS, off the event loop).
        self._host_check = HostCheck(app, AllowedHosts.for_server(host, (), self._allowed_hosts))
        ssl_context = tls.server_ssl_context() if tls is not None else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when
        # the listening socket says TCP; without it each answer waits ~40 ms for a delayed ACK.
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port = self._socket.getsockname()[1]
        self.tls = tls
        self.limits = limits or ConnectionLimits()
        self._guard = ConnectionGuard(self.limits, partial(identified, app.state))
        config = uvicorn.Config(
            self._host_check,
            http=self._guard.protocol,  # type: ignore[arg-type]
            ws="none",  # no route takes a websocket: refuse upgrades in the protocol
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=self.limits.idle_timeout,  # type: ignore[arg-type]
            # Requests still in progress when the driver stops (workers' long polls) are cut
            # after this: one from a host that vanished would be waited for until its poll
            # ended (up to 30 s), its worker gone.
            timeout_graceful_shutdown=SHUTDOWN_GRACE,
            # The context holds the key in memory: no key file for uvicorn to read.
            ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context else None,
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def connections(self) -> tuple[int, int]:
        """(held, idle): the connections open now, and how many of them are on the clock
        (wait for a request head, or for their request without the token to be answered);
        the rest have an authenticated request in progress."""
        return len(self._server.server_state.connections), self._guard.idle

    async def start(self) -> None:
        names = await asyncio.to_thread(own_names)
        self._host_check.allowed = AllowedHosts.for_server(self.host, names, self._allowed_hosts)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._socket.close()
