"""What a peer without the job token can hold on the control ports: connections, bytes, time.

Heartbeat port (`BeatPortLimits`, served by `BeatServer`): a connection that has not said
HELLO with the job token (a *stranger*) may buffer at most one frame and must say it within
`HELLO_WITHIN` seconds. At most `max_connections` are open: one more closes the oldest
stranger (after reading what it sent: a worker's hello arrives with its connection), or itself
when every connection has said hello. A stranger older than `STRANGER_GRACE` counts against
`max_strangers` and `max_strangers_per_peer` (of one address), and the oldest past them are
closed the same way at each look; the grace lets a burst of workers connecting at once (a
driver restart, a test bed on loopback) say hello first. Connections that said hello count
toward `max_connections` only: they hold the job token, and many workers may share one address.
Every connection is read `READ_PER_LOOK` bytes a look at most.

gRPC port (`GrpcPortLimits`, gRPC core's own channel arguments): a connection that has not sent
its HTTP/2 SETTINGS within `handshake_timeout` (after TLS, with TLS) is closed, one with no
call in progress is closed after `idle_timeout` (a worker's event stream is a call in
progress for as long as it is open, so it is never cut), and past `max_connections` gRPC
closes a new connection at once. A call without the token is refused from its headers
(`TokenCheck`), so a stranger's connection goes idle and closes. Calls per connection are not
capped (`grpc.max_concurrent_streams` made gRPC refuse, UNAVAILABLE, calls that waited while
the event loop was busy, even at 1,000 a connection); the calls waiting for the service are
bounded server-wide by `grpc.server.max_pending_requests_hard_limit` (see `server.py`).

The connection caps come from `descriptor_budget`: the ports together never take the
descriptors the driver keeps for its own work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic.driver.descriptors import descriptor_budget
from elastic.protocol.beats import MAX_FRAME

HELLO_WITHIN = 10.0  # seconds a new heartbeat connection has to say who it is
MAX_STRANGERS = 1_024  # heartbeat connections without a hello past the grace, at most
MAX_STRANGERS_PER_PEER = 256  # of them from one address, at most
STRANGER_GRACE = 3.0  # seconds a stranger may wait before those two caps count it
STRANGER_BYTES = 2 + MAX_FRAME  # bytes a stranger may have buffered: one frame, its length
READ_PER_LOOK = 8 * 1024  # bytes read from one connection per look: two frames, ~75 beats

GRPC_HANDSHAKE_TIMEOUT = 10.0  # seconds for TLS and the client's HTTP/2 SETTINGS, at most
GRPC_IDLE_TIMEOUT = 15.0  # seconds a connection may hold no call before gRPC closes it


def _beat_connections() -> int:
    return descriptor_budget().beats


def _grpc_connections() -> int:
    return descriptor_budget().grpc


@dataclass(frozen=True)
class BeatPortLimits:
    """How many connections the heartbeat port holds (defaults: see the module)."""

    max_connections: int = field(default_factory=_beat_connections)
    max_strangers: int = MAX_STRANGERS
    max_strangers_per_peer: int = MAX_STRANGERS_PER_PEER

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_strangers, self.max_strangers_per_peer) < 1:
            raise ValueError(f"heartbeat port limits must be positive: {self}")


@dataclass(frozen=True)
class GrpcPortLimits:
    """What gRPC core bounds on the control port (defaults: see the module)."""

    max_connections: int = field(default_factory=_grpc_connections)
    handshake_timeout: float = GRPC_HANDSHAKE_TIMEOUT
    idle_timeout: float = GRPC_IDLE_TIMEOUT

    def __post_init__(self) -> None:
        if self.max_connections < 1 or not (self.handshake_timeout > 0 and self.idle_timeout > 0):
            raise ValueError(f"gRPC port limits must be positive: {self}")

    def options(self) -> list[tuple[str, int]]:
        """The gRPC server's channel arguments that apply these limits."""
        return [
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout * 1000)),
            ("grpc.max_connection_idle_ms", round(self.idle_timeout * 1000)),
        ]
