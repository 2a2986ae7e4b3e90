"""The heartbeat port: workers' heartbeats (`elastic.protocol.beats`), read in batches on the
driver's event loop and reported to the `WorkerListener`.

The port's sockets are not the event loop's: they sit in an epoll set of their own that the
loop looks at every `TICK` seconds, reading every connection that has data in one pass. A
selector callback per connection (asyncio's protocols) woke the loop once per heartbeat,
which cost about 35 us of CPU each, 3.5 % of a core for 1,000 workers beating once a second;
a pass over many costs a few microseconds a beat. A beat is reported at most `TICK` seconds
after it arrived, against heartbeat intervals of half a second and more.

A look costs the loop a bounded time whatever peers send: it accepts `ACCEPTS_PER_LOOK`
connections at most, reads `READ_PER_LOOK` bytes from each connection at most (what is left is
read at the next look), and acts on frames as they arrive, so a connection's buffer holds less
than two frames. A connection without a hello may buffer one frame (`STRANGER_BYTES`), must say
hello within `HELLO_WITHIN` s, and waits among `BeatPortLimits`' few strangers; see
`elastic.driver.control.port_limits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import select
import socket
import ssl
import time

from elastic.driver.connection_limits import OverLimitLog, WaitingConnections
from elastic.driver.control.events import WorkerListener
from elastic.driver.control.port_limits import (
    HELLO_WITHIN,
    READ_PER_LOOK,
    STRANGER_BYTES,
    STRANGER_GRACE,
    BeatPortLimits,
)
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

TICK = 0.1  # seconds between two looks at the port's connections
ACCEPTS_PER_LOOK = 1_024  # new connections taken per look, at most (the backlog keeps the rest)
_READ = select.EPOLLIN | select.EPOLLRDHUP
_CHUNK = 4096
_BATCH = 1024  # events taken from epoll at once


class _Connection:
    """One worker's heartbeat connection: its hello, then its beats."""

    __slots__ = ("sock", "peer", "received", "worker_id", "opened", "shaken", "looked")

    def __init__(self, sock: socket.socket, peer: str, tls: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.received = bytearray()
        self.worker_id: str | None = None
        self.opened = time.monotonic()
        self.shaken = not tls  # the TLS handshake is done (or there is none)
        self.looked = -1  # the number of the last look that read it


class BeatServer:
    """Serves the heartbeat port on `host` (a free port, known after `start`).

    A connection must open with a HELLO carrying the job token and a valid worker id within
    `hello_within` seconds, else it is closed; each BEAT after it is reported to
    `listener.heartbeat`, at most `tick` seconds after it arrived. Any frame the driver cannot
    take is answered with REFUSED and the connection closed: UNAUTHENTICATED (wrong token: each
    refused address is logged once), INVALID_ARGUMENT (a malformed frame, a bad id, a beat
    before the hello, a first frame longer than one frame), NOT_FOUND (the listener does not
    count the worker alive) or UNAVAILABLE (the listener raised). With `ssl_context` it accepts
    TLS only. Runs on the event loop that calls `start`.

    `limits` bounds the connections held (`BeatPortLimits`; default: this process's share of
    its open-file limit). A connection over a limit is closed without a word (its worker, if
    it is one, reconnects with a backoff); each kind of such closing is logged at most once a
    minute (`OverLimitLog`). Failing to accept (out of descriptors) is logged the same way and
    tried again at the next look.
    """

    def __init__(
        self,
        listener: WorkerListener,
        token: str,
        host: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        hello_within: float = HELLO_WITHIN,
        limits: BeatPortLimits | None = None,
        tick: float = TICK,
    ) -> None:
        self._listener = listener
        self._token = token.encode()
        self.host = host
        self._ssl = ssl_context
        self.hello_within = hello_within
        self.limits = limits if limits is not None else BeatPortLimits()
        self.tick = tick
        self._socket: socket.socket | None = None
        self._poll: select.epoll | None = None
        self._connections: dict[int, _Connection] = {}
        self._strangers: WaitingConnections[_Connection] = WaitingConnections(
            self.limits.max_strangers, self.limits.max_strangers_per_peer
        )  # no hello yet, oldest first
        self._unread: dict[int, _Connection] = {}  # read up to the budget: more may wait
        self._looks = 0
        self._next: asyncio.TimerHandle | None = None
        self._over_limit = OverLimitLog(log, "heartbeat port")
        self.refused_peers: set[str] = set()

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before `start`."""
        if self._socket is None:
            raise RuntimeError("the heartbeat port is not open")
        return int(self._socket.getsockname()[1])

    @property
    def held(self) -> int:
        """Connections open now, with or without a hello."""
        return len(self._connections)

    @property
    def strangers(self) -> int:
        """Connections open now that have not said hello."""
        return len(self._strangers)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet acted on, over every connection (less than two frames
        each)."""
        return sum(len(connection.received) for connection in self._connections.values())

    async def start(self) -> None:
        """Bind and serve. Raises RuntimeError when the address cannot be bound."""
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            listening = socket.socket(family, socket.SOCK_STREAM)
            try:
                listening.bind((self.host, 0))
                listening.listen(4096)
            except OSError:
                listening.close()
                raise
        except OSError as err:
            raise RuntimeError(f"cannot open a heartbeat port on {self.host}: {err}") from err
        listening.setblocking(False)
        self._socket, self._poll = listening, select.epoll()
        self._poll.register(listening.fileno(), select.EPOLLIN)
        self._next = asyncio.get_running_loop().call_later(self.tick, self._look)

    async def stop(self) -> None:
        """Stop listening and close every connection (its worker reconnects). Idempotent."""
        if self._next is not None:
            self._next.cancel()
            self._next = None
        for connection in list(self._connections.values()):
            self._close(connection)
        if self._poll is not None:
            self._poll.close()
            self._poll = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _look(self) -> None:
        """One pass: accept, read every connection with data, close silent strangers and
        those past the strangers' caps."""
        try:
            self._looks += 1
            self._take_ready()
            if self._strangers:
                self._trim_strangers(time.monotonic())
        except Exception:
            log.exception("driver error reading heartbeats")
        finally:
            if self._poll is not None:
                self._next = asyncio.get_running_loop().call_later(self.tick, self._look)

    def _take_ready(self) -> None:
        """Read the connections left with data at the last look (a TLS socket may hold
        decrypted data that epoll does not announce), then every one epoll names, each once."""
        assert self._poll is not None and self._socket is not None
        unread, self._unread = self._unread, {}
        for connection in unread.values():
            if connection.sock.fileno() >= 0:  # not closed since
                self._read(connection)
        listening = self._socket.fileno()
        for _ in range(len(self._connections) // _BATCH + 2):
            ready = self._poll.poll(0, _BATCH)
            for fd, _ in ready:
                if fd == listening:
                    self._accept()
                elif (connection := self._connections.get(fd)) is not None and (
                    connection.looked != self._looks
                ):
                    self._read(connection)
            if len(ready) < _BATCH:
                return

    def _accept(self) -> None:
        assert self._socket is not None and self._poll is not None
        for _ in range(ACCEPTS_PER_LOOK):
            try:
                sock, address = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of descriptors, say: taken again at the next look
                self._over_limit.note(f"cannot accept connections ({err.strerror or err})")
                return
            peer = str(address[0])
            if not self._make_room():
                sock.close()
                self._over_limit.note(
                    f"refused connections: {self.limits.max_connections} are open, all of "
                    "workers that said hello"
                )
                continue
            sock.setblocking(False)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            connection = _Connection(sock, peer, self._ssl is not None)
            self._connections[sock.fileno()] = connection
            self._strangers.add(connection, peer, connection.opened)
            self._poll.register(sock.fileno(), _READ)
            self._read(connection)  # a hello may be there already

    def _make_room(self) -> bool:
        """Close the oldest strangers until one more connection fits `max_connections`; False
        when every open connection has said hello and the port holds its most."""
        while len(self._connections) >= self.limits.max_connections:
            if (oldest := self._strangers.oldest()) is None:
                return False
            self._evict(
                oldest,
                f"closed the oldest connection without a hello: {self.limits.max_connections} "
                "are open",
            )
        return True

    def _trim_strangers(self, now: float) -> None:
        """Close the strangers that said no hello within `hello_within`, then the oldest of
        those older than `STRANGER_GRACE` past the strangers' caps (per address, then all)."""
        for connection in self._strangers.opened_before(now - self.hello_within):
            self._over_limit.note(
                f"closed connections that said no hello within {self.hello_within:g} s"
            )
            self._close(connection)
        for connection in self._strangers.over_limits(now - STRANGER_GRACE):
            crowded = self._strangers.of_peer(connection.peer) > self._strangers.max_per_peer
            self._evict(
                connection,
                f"closed the oldest connections without a hello of an address with more than "
                f"{self._strangers.max_per_peer}"
                if crowded
                else f"closed the oldest of more than {self._strangers.max_total} connections "
                "without a hello",
            )

    def _evict(self, connection: _Connection, reason: str) -> None:
        """Make `connection` stop waiting for its hello: read what it sent (a worker's hello
        comes with its connection); close it if that was no hello."""
        self._read(connection)
        if connection in self._strangers:
            self._over_limit.note(reason)
            self._close(connection)

    def _read(self, connection: _Connection) -> None:
        """Read what `connection` has, within its budget for this look (a stranger: what
        completes one frame; with a hello: `READ_PER_LOOK` bytes), and act on each whole
        frame as it arrives. A connection left with its budget spent is read again at the next
        look."""
        sock, ended, taken = connection.sock, False, 0
        connection.looked = self._looks
        try:
            if not connection.shaken:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                connection.shaken = True
            while True:
                if connection.worker_id is None:
                    room = STRANGER_BYTES - len(connection.received)
                    if room <= 0:  # cannot happen: a whole frame is always taken
                        self._refuse(connection, "INVALID_ARGUMENT", "no hello in the first frame")
                        return
                else:
                    room = READ_PER_LOOK - taken
                    if room <= 0:
                        self._unread[sock.fileno()] = connection
                        return
                data = sock.recv(min(_CHUNK, room))
                if not data:
                    ended = True  # the worker closed it
                    break
                taken += len(data)
                connection.received += data
                if not self._take_frames(connection):
                    return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # nothing more for now
        except OSError:  # reset, or a failed TLS handshake
            ended = True
        if ended:
            self._close(connection)

    def _take_frames(self, connection: _Connection) -> bool:
        """Act on every whole frame received; False when one was refused (the connection is
        closed)."""
        try:
            for body in take_frames(connection.received):
                if not self._take(connection, body):
                    return False
        except FrameError as err:
            self._refuse(connection, "INVALID_ARGUMENT", str(err))
            return False
        return True

    def _take(self, connection: _Connection, body: bytes) -> bool:
        """Act on one frame; False when it was refused (the connection is closed)."""
        worker_id = connection.worker_id
        if body[0] == BEAT and worker_id is not None:
            refused = refusal(worker_id, self._listener.heartbeat, worker_id, *parse_beat(body))
            if refused is not None:
                self._refuse(connection, refused[0].name, refused[1])
                return False
            return True
        if body[0] == HELLO and worker_id is None:
            token, worker_id = parse_hello(body)
            if not hmac.compare_digest(token.encode(), self._token):
                note_refusal(self.refused_peers, connection.peer, "heartbeat")
                self._refuse(connection, "UNAUTHENTICATED", "missing or wrong job token")
                return False
            if problem := check_id(worker_id):
                self._refuse(connection, "INVALID_ARGUMENT", problem)
                return False
            connection.worker_id = worker_id
            self._strangers.discard(connection)
            return True
        self._refuse(connection, "INVALID_ARGUMENT", f"unexpected frame kind {body[0]} here")
        return False

    def _refuse(self, connection: _Connection, code: str, details: str) -> None:
        # A few bytes: there is room for them. If not, the worker reconnects and hears it again.
        with contextlib.suppress(OSError, ValueError):
            connection.sock.send(refused_frame(code, details))
        self._close(connection)

    def _close(self, connection: _Connection) -> None:
        self._strangers.discard(connection)
        fd = connection.sock.fileno()
        if fd < 0:
            return
        self._connections.pop(fd, None)
        self._unread.pop(fd, None)
        if self._poll is not None:
            with contextlib.suppress(OSError):
                self._poll.unregister(fd)
        connection.sock.close()
