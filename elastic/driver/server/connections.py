"""How many connections the driver's HTTP server holds, for how long, and which give way.

uvicorn bounds neither: its keep-alive timer starts only after a first answer and stops at the
first byte of the next request, so a peer that opens connections and sends half a request
line (slowloris), or a whole head and then no body, holds each of them for good, until the
driver runs out of file descriptors and can no longer accept a worker, start one, or open its
log. Here a connection is *on the clock* from its opening (after the TLS handshake, with
`--tls`) and from each answer, until a request head arrives that carries the job token or a
live page session (`identified`):

* a connection on the clock for `idle_timeout` seconds is closed: one idle between requests,
  one trickling its head, and one whose unauthenticated request (the page's login, its files,
  `/metrics`) has not been read and answered by then, its body included. The same number is
  uvicorn's keep-alive timeout: an idle connection is a connection waiting for a head.
* at most `max_connections` are held. Past it, connections on the clock are closed, in this
  order: strangers that sent a request without the token, strangers that have sent nothing
  yet, connections that carried the token and wait for their next request; each kind oldest
  first. When none is on the clock (every one has an authenticated request in progress), the
  newest are closed. This is weighed two turns of the event loop after a connection opens, once
  the head a client sends with its connection has been read, so a worker's new connection has
  shown its token before a burst of strangers is weighed against it: an authenticated request
  always finds room while strangers are held. Past 1.5 times the limit (a burst faster than
  that), each new connection closes the oldest stranger that asked without the token at once,
  or, with none, is itself closed. Workers retry any closing.
* at most `max_per_peer` strangers from one address: past it, that address's oldest are
  closed. Connections that carried the token or a page session do not count, so a host of
  many workers is never held back, and a flood from one address cannot fill the table for the
  others (a neighbour on this machine has every 127.x.y.z address, though: the order above is
  what keeps workers served).

A request with the token is bounded by its route (long-polls end by their timeout), not here.
Each limit reached is logged at most once a minute (`LimitLog`). uvicorn's own
`limit_concurrency` is not used: it counts idle connections too, answers 503 to every request
(the established workers' included) once that many are open, and still accepts and holds more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from elastic.driver.descriptors import HTTP_CONNECTIONS, descriptor_budget
from elastic.driver.server.limits import LimitLog

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]

MAX_CONNECTIONS = HTTP_CONNECTIONS
"""The most connections held, when the open-file limit allows: a worker holds one, or a few
while torch calls its Store from several threads, so 1,000 workers need ~1,000-4,000."""

IDLE_TIMEOUT = 10.0
"""Seconds a connection may be on the clock. Above the 5 s after which httpx (the workers'
client) drops an idle connection itself, so that a worker does not send a request on a
connection the driver is closing."""

MAX_PER_PEER = 512
"""The most connections one address may hold before one of them carried the token: a host of
128 workers opening four each at once (their first requests on the way) stays within it."""


def _default_max_connections() -> int:
    """The HTTP port's share of the open-file limit (`descriptor_budget`): `MAX_CONNECTIONS`
    at a limit of 65,536, less below; the driver keeps the rest for its other ports, workers'
    pipes and logs, ssh and discovery."""
    return descriptor_budget().http


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = field(default_factory=_default_max_connections)
    idle_timeout: float = IDLE_TIMEOUT
    max_per_peer: int = MAX_PER_PEER

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_peer < 1 or not self.idle_timeout > 0:
            raise ValueError(f"connection limits must be positive: {self}")


class _Line:
    """Connections on the clock of one kind, oldest first, also by peer address."""

    def __init__(self) -> None:
        self.all: dict[GuardedH11Protocol, None] = {}  # insertion order: oldest first
        self.by_peer: dict[str, dict[GuardedH11Protocol, None]] = {}

    def __len__(self) -> int:
        return len(self.all)

    def add(self, connection: GuardedH11Protocol) -> None:
        self.all[connection] = None
        self.by_peer.setdefault(connection.peer, {})[connection] = None

    def remove(self, connection: GuardedH11Protocol) -> None:
        if self.all.pop(connection, False) is None:  # it was in line
            peers = self.by_peer[connection.peer]
            del peers[connection]
            if not peers:
                del self.by_peer[connection.peer]

    def oldest(self, peer: str | None = None) -> GuardedH11Protocol | None:
        """The oldest in line (of `peer`, when given); None when there is none."""
        line = self.all if peer is None else self.by_peer.get(peer, {})
        return next(iter(line), None)

    def count(self, peer: str) -> int:
        return len(self.by_peer.get(peer, ()))


class ConnectionGuard:
    """One server's limits and its connections on the clock, in three lines that give way in
    this order (see the module's docstring): strangers that sent a request without the token
    (the page's login, `/metrics`, a refused one), strangers that have sent no request head yet
    (a worker's new connection, its head on the way, is one for a moment), and connections
    that carried the token before and wait for their next request. Each line oldest first.

    `protocol` is the factory to give uvicorn (`Config(http=guard.protocol)`); `identified`
    says whether a request head (its lower-case headers) carries the token or a page session.
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        identified: Callable[[Headers], bool] = lambda headers: False,
    ) -> None:
        self.limits = limits
        self.identified = identified
        self._asked, self._fresh, self._known = _Line(), _Line(), _Line()
        self._closing: set[GuardedH11Protocol] = set()  # closed here, not yet gone
        self._held: set[Any] = set()  # the server's open connections (uvicorn's set)
        self._peers_to_check: set[str] = set()
        self._room_check_due = False
        self.log = LimitLog(log)

    @property
    def idle(self) -> int:
        """How many connections are on the clock now (wait for a head, or for their
        unauthenticated request to be read and answered): those that can be closed for room."""
        return len(self._asked) + len(self._fresh) + len(self._known)

    def protocol(self, **uvicorn_arguments: Any) -> GuardedH11Protocol:
        return GuardedH11Protocol(guard=self, **uvicorn_arguments)

    def _line_of(self, connection: GuardedH11Protocol) -> _Line:
        if connection.known:
            return self._known
        return self._asked if connection.asked else self._fresh

    def on_clock(self, connection: GuardedH11Protocol) -> None:
        """`connection` is on the clock (moves to the end of its kind's line)."""
        self.off_clock(connection)
        self._line_of(connection).add(connection)

    def off_clock(self, connection: GuardedH11Protocol) -> None:
        """`connection` has an authenticated request in progress, or is gone."""
        for line in (self._asked, self._fresh, self._known):
            line.remove(connection)

    def admit(self, connection: GuardedH11Protocol) -> None:
        """A new `connection` (in `connection.connections` now, on the clock): the limits are
        enforced two turns of the event loop later (`_make_room`), once the request head a
        client sends with its connection has been read; past 1.5 times `max_connections` at
        once, closing the oldest stranger that asked, or `connection` itself."""
        self._held = connection.connections
        if len(self._held) - len(self._closing) > self.limits.max_connections * 3 // 2:
            self.log.note(
                "burst",
                "HTTP connections arrive faster than the limit of %d can be kept: each new one "
                "closes the oldest that asked without the token, or itself",
                self.limits.max_connections,
            )
            victim = self._asked.oldest()
            self.close(victim or connection)
            if victim is None:
                return
        self._peers_to_check.add(connection.peer)
        if not self._room_check_due:
            self._room_check_due = True
            loop = connection.loop
            loop.call_soon(loop.call_soon, self._make_room)

    def _make_room(self) -> None:
        """Close the oldest strangers of each address past `max_per_peer`, then connections
        on the clock, in the order of the lines, past `max_connections`; with none left on the
        clock (every one has an authenticated request in progress), hold more for a while."""
        self._room_check_due = False
        peers, self._peers_to_check = self._peers_to_check, set()
        for peer in peers:
            while self._asked.count(peer) + self._fresh.count(peer) > self.limits.max_per_peer:
                self.log.note(
                    "per-peer",
                    "%s reached the limit of %d HTTP connections without the token: each new "
                    "one closes its oldest",
                    peer,
                    self.limits.max_per_peer,
                )
                self.close(self._asked.oldest(peer) or self._fresh.oldest(peer))  # type: ignore[arg-type]
        excess = len(self._held) - len(self._closing) - self.limits.max_connections
        if excess > 0:
            self.log.note(
                "full",
                "HTTP connections reached the limit of %d: a new one closes the oldest "
                "without the token, else the longest idle",
                self.limits.max_connections,
            )
        for _ in range(excess):
            victim = self._asked.oldest() or self._fresh.oldest() or self._known.oldest()
            if victim is None:
                break
            self.close(victim)

    def close(self, connection: GuardedH11Protocol, gently: bool = False) -> None:
        """Close `connection` for a limit: `gently` lets what was written go first (when the
        peer reads it), else it is reset."""
        self.off_clock(connection)
        self._closing.add(connection)
        if gently and not connection.transport.get_write_buffer_size():
            connection.transport.close()
        else:  # a peer that does not read would hold a closing socket for good
            connection.transport.abort()

    def gone(self, connection: GuardedH11Protocol) -> None:
        """`connection` is closed."""
        self.off_clock(connection)
        self._closing.discard(connection)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the clock and the limits of `ConnectionGuard`."""

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
        self.peer = ""
        self.known = False  # has carried the token or a page session
        self.asked = False  # has sent a request head without either

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        self._start_clock()
        self._guard.admit(self)

    def handle_events(self) -> None:
        scope = self.scope
        super().handle_events()
        if self.scope is not scope:  # a request head arrived (its request now runs)
            self._head_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request: see handle_events
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._start_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._guard.gone(self)
        super().connection_lost(exc)

    def _start_clock(self) -> None:
        """Restart the clock (waiting for the next head), unless the connection is closing."""
        if self.transport.is_closing():
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self._guard.limits.idle_timeout, self._expire)
        self._guard.on_clock(self)

    def _stop_clock(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._guard.off_clock(self)

    def _head_arrived(self) -> None:
        """An authenticated request stops the clock; any other runs on it (started now if it
        was stopped: a request pipelined behind an authenticated one)."""
        if self._guard.identified(self.headers):
            self.known = True
            self._stop_clock()
        elif self._deadline is None:
            self.asked = True
            self._start_clock()
        else:
            self.asked = True
            self._guard.on_clock(self)  # into its new line; the clock runs on

    def _expire(self) -> None:
        self._deadline = None
        answering = self.cycle is not None and not self.cycle.response_complete
        if answering and not self.transport.is_closing():
            self._guard.log.note(
                "slow",
                "closed HTTP connections whose request without the token was not read and "
                "answered within %g s (first from %s)",
                self._guard.limits.idle_timeout,
                self.peer,
            )
        self._guard.close(self, gently=True)
