"""Builds the FastAPI app and serves it with uvicorn inside the driver's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from elastic.driver.server import kv, rendezvous, status
from elastic.driver.server.auth import require_token
from elastic.driver.server.services import Services
from elastic.protocol.http import ErrorResponse

log = logging.getLogger(__name__)


def create_app(services: Services) -> FastAPI:
    """The HTTP API; every route requires the job token."""
    app = FastAPI(
        title="elasticrun driver",
        version="1",
        dependencies=[Depends(require_token)],
        responses={401: {"model": ErrorResponse}, 422: {"description": "malformed request"}},
    )
    app.state.services = services
    app.state.refused_peers = set()
    for module in (rendezvous, kv, status):
        app.include_router(module.router)

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
    """uvicorn on an already-bound socket, so the port is known before workers launch."""

    def __init__(self, app: FastAPI, host: str, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when
        # the listening socket says TCP; without it each answer waits ~40 ms for a delayed ACK.
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=75
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
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
