"""The heartbeat port: workers' heartbeats (`elastic.protocol.beats`), read by an asyncio
protocol on the driver's event loop and reported to the `WorkerListener` as they arrive."""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl

from elastic.driver.control.events import WorkerListener
from elastic.driver.control.refusals import check_id, refusal
from elastic.driver.server.auth import note_refusal
from elastic.protocol.beats import (
    BEAT,
    HELLO,
    FrameError,
    parse_beat,
    parse_hello,
    refused_frame,
    take_frames,
)

log = logging.getLogger(__name__)

HELLO_WITHIN = 10.0  # seconds a new connection has to say who it is


class BeatServer:
    """Serves the heartbeat port on `host` (a free port, known after `start`).

    A connection must open with a HELLO carrying the job token and a valid worker id within
    `hello_within` seconds; each BEAT after it is reported to `listener.heartbeat`. Any frame
    the driver cannot take is answered with REFUSED and the connection closed:
    UNAUTHENTICATED (wrong token: each refused address is logged once), INVALID_ARGUMENT (a
    malformed frame, a bad id, a beat before the hello), NOT_FOUND (the listener does not count
    the worker alive) or UNAVAILABLE (the listener raised). With `ssl_context` it accepts TLS
    only. Runs on the event loop that calls `start`.
    """

    def __init__(
        self,
        listener: WorkerListener,
        token: str,
        host: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        hello_within: float = HELLO_WITHIN,
    ) -> None:
        self._listener = listener
        self._token = token.encode()
        self.host = host
        self._ssl = ssl_context
        self.hello_within = hello_within
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._connections: set[_BeatConnection] = set()
        self.refused_peers: set[str] = set()

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before `start`."""
        if self._port is None:
            raise RuntimeError("the heartbeat port is not open")
        return self._port

    async def start(self) -> None:
        """Bind and serve. Raises RuntimeError when the address cannot be bound."""
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: _BeatConnection(self), self.host, 0, ssl=self._ssl, backlog=4096
            )
        except OSError as err:
            raise RuntimeError(f"cannot open a heartbeat port on {self.host}: {err}") from err
        self._server, self._port = server, server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every connection (its worker reconnects). Idempotent."""
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            for connection in list(self._connections):
                connection.close()
            await server.wait_closed()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def report(self, worker_id: str, round_: int, commit: int) -> tuple[str, str] | None:
        """Report one beat; the refusal (status name, details) when the driver refuses it."""
        refused = refusal(worker_id, self._listener.heartbeat, worker_id, round_, commit)
        return None if refused is None else (refused[0].name, refused[1])

    def opened(self, connection: _BeatConnection) -> None:
        self._connections.add(connection)

    def closed(self, connection: _BeatConnection) -> None:
        self._connections.discard(connection)


class _BeatConnection(asyncio.Protocol):
    """One worker's heartbeat connection: its hello, then its beats."""

    def __init__(self, server: BeatServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._worker_id: str | None = None
        self._transport: asyncio.Transport | None = None
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server.opened(self)
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(self._server.hello_within, self.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.closed(self)
        if self._hello_timer is not None:
            self._hello_timer.cancel()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            for body in take_frames(self._buffer):
                if not self._take(body):
                    return
        except FrameError as err:
            self._refuse("INVALID_ARGUMENT", str(err))

    def _take(self, body: bytes) -> bool:
        """Act on one frame; False when it was refused (the connection is closing)."""
        worker_id = self._worker_id
        if body[0] == BEAT and worker_id is not None:
            refused = self._server.report(worker_id, *parse_beat(body))
            if refused is not None:
                self._refuse(*refused)
                return False
            return True
        if body[0] == HELLO and worker_id is None:
            token, worker_id = parse_hello(body)
            if not self._server.token_matches(token):
                peer = self._transport.get_extra_info("peername") if self._transport else None
                note_refusal(
                    self._server.refused_peers, peer[0] if peer else "unknown", "heartbeat"
                )
                self._refuse("UNAUTHENTICATED", "missing or wrong job token")
                return False
            if problem := check_id(worker_id):
                self._refuse("INVALID_ARGUMENT", problem)
                return False
            self._worker_id = worker_id
            if self._hello_timer is not None:
                self._hello_timer.cancel()
            return True
        self._refuse("INVALID_ARGUMENT", f"unexpected frame kind {body[0]} here")
        return False

    def _refuse(self, code: str, details: str) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(refused_frame(code, details))
            self._transport.close()
