"""How many connections the driver's HTTP server holds, and how long one may idle.

uvicorn bounds neither: its keep-alive timer starts only after a first answer and stops at the
first byte of the next request, so a peer that opens connections and sends half a request
line (slowloris) holds each of them for good, until the driver runs out of file descriptors
and can no longer accept a worker, start one, or open its log. Here, without the token:

* a connection must deliver a complete request head within `idle_timeout` seconds of opening
  (after the TLS handshake, with `--tls`) or of its previous answer, or it is closed. The same
  number is uvicorn's keep-alive timeout: an idle connection is a connection waiting for a head.
* at most `max_connections` are held. One more closes the connection that has waited longest
  for a request head (an idle or slowloris one: a real client sends its head in one write, so
  it is never the oldest waiter for long), or, when every connection has a request in progress,
  is itself closed at once. Workers retry both (a connection error is a transport error).

A request whose head has arrived is not timed here: without the token it is refused from its
head (`TokenGate`), and with it, it is bounded by its route (long-polls end by their timeout).
uvicorn's own `limit_concurrency` is not used: it counts idle connections too, answers 503 to
every request (the established workers' included) once that many are open, and still accepts
and holds more.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 8192
"""The most connections held, when the open-file limit allows: a worker holds one, or a few
while torch calls its Store from several threads, so 1,000 workers need ~1,000-4,000."""

IDLE_TIMEOUT = 10.0
"""Seconds a connection may wait without a complete request head. Above the 5 s after which
httpx (the workers' client) drops an idle connection itself, so that a worker does not send a
request on a connection the driver is closing."""


def _default_max_connections() -> int:
    """`MAX_CONNECTIONS`, or half the open-file limit where that is less: the driver keeps the
    other half for workers' pipes and logs, gRPC streams, ssh and discovery."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 2))


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = field(default_factory=_default_max_connections)
    idle_timeout: float = IDLE_TIMEOUT

    def __post_init__(self) -> None:
        if self.max_connections < 1 or not self.idle_timeout > 0:
            raise ValueError(f"connection limits must be positive: {self}")


class ConnectionGuard:
    """One server's limits and its connections that wait for a request head, oldest first.

    `protocol` is the factory to give uvicorn (`Config(http=guard.protocol)`).
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._waiting: dict[GuardedH11Protocol, None] = {}  # insertion order: oldest first
        self._warned = False

    @property
    def idle(self) -> int:
        """How many connections wait for a request head now."""
        return len(self._waiting)

    def protocol(self, **uvicorn_arguments: Any) -> GuardedH11Protocol:
        return GuardedH11Protocol(guard=self, **uvicorn_arguments)

    def waiting(self, connection: GuardedH11Protocol) -> None:
        """`connection` now waits for a request head (moves to the end of the line)."""
        self._waiting.pop(connection, None)
        self._waiting[connection] = None

    def served(self, connection: GuardedH11Protocol) -> None:
        """`connection` has a request in progress, or is gone."""
        self._waiting.pop(connection, None)

    def make_room(self) -> bool:
        """Close the connection that has waited longest for a request head; False if none
        waits (every connection has a request in progress)."""
        if not self._warned:
            self._warned = True
            log.warning(
                "HTTP connections reached the limit of %d: from now on a new one closes the "
                "longest idle one, or is refused while none is idle",
                self.limits.max_connections,
            )
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        self.served(oldest)
        oldest.transport.abort()
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadline and the limit of `ConnectionGuard`."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        guard: ConnectionGuard,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._guard = guard
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = len(self.connections) >= self._guard.limits.max_connections
        super().connection_made(transport)
        if full and not self._guard.make_room():
            transport.abort()
            return
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        """Start the clock for the next request head, unless one is in already or the
        connection is closing."""
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self._guard.limits.idle_timeout, self._expire)
        self._guard.waiting(self)

    def _head_arrived(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._guard.served(self)

    def _expire(self) -> None:
        self._deadline = None
        self._guard.served(self)
        if not self.transport.is_closing():
            self.transport.close()
