"""The heartbeat port: workers' heartbeats (`elastic.protocol.beats`), read in batches on the
driver's event loop and reported to the `WorkerListener`.

The port's sockets are not the event loop's: they sit in an epoll set of their own that the
loop looks at every `TICK` seconds, reading every connection that has data in one pass. A
selector callback per connection (asyncio's protocols) woke the loop once per heartbeat,
which cost about 35 us of CPU each, 3.5 % of a core for 1,000 workers beating once a second;
a pass over many costs a few microseconds a beat. A beat is reported at most `TICK` seconds
after it arrived, against heartbeat intervals of half a second and more.
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
TICK = 0.1  # seconds between two looks at the port's connections
_READ = select.EPOLLIN | select.EPOLLRDHUP
_CHUNK = 4096


class _Connection:
    """One worker's heartbeat connection: its hello, then its beats."""

    __slots__ = ("sock", "peer", "received", "worker_id", "opened", "shaken")

    def __init__(self, sock: socket.socket, peer: str, tls: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.received = bytearray()
        self.worker_id: str | None = None
        self.opened = time.monotonic()
        self.shaken = not tls  # the TLS handshake is done (or there is none)


class BeatServer:
    """Serves the heartbeat port on `host` (a free port, known after `start`).

    A connection must open with a HELLO carrying the job token and a valid worker id within
    `hello_within` seconds, else it is closed; each BEAT after it is reported to
    `listener.heartbeat`, at most `tick` seconds after it arrived. Any frame the driver cannot
    take is answered with REFUSED and the connection closed: UNAUTHENTICATED (wrong token: each
    refused address is logged once), INVALID_ARGUMENT (a malformed frame, a bad id, a beat
    before the hello), NOT_FOUND (the listener does not count the worker alive) or UNAVAILABLE
    (the listener raised). With `ssl_context` it accepts TLS only. Runs on the event loop that
    calls `start`.
    """

    def __init__(
        self,
        listener: WorkerListener,
        token: str,
        host: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        hello_within: float = HELLO_WITHIN,
        tick: float = TICK,
    ) -> None:
        self._listener = listener
        self._token = token.encode()
        self.host = host
        self._ssl = ssl_context
        self.hello_within = hello_within
        self.tick = tick
        self._socket: socket.socket | None = None
        self._poll: select.epoll | None = None
        self._connections: dict[int, _Connection] = {}
        self._strangers: dict[int, _Connection] = {}  # no hello yet
        self._next: asyncio.TimerHandle | None = None
        self.refused_peers: set[str] = set()

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before `start`."""
        if self._socket is None:
            raise RuntimeError("the heartbeat port is not open")
        return int(self._socket.getsockname()[1])

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
        """One pass: accept, read every connection with data, close silent strangers."""
        try:
            self._take_ready()
            if self._strangers:
                self._close_strangers(time.monotonic() - self.hello_within)
        except Exception:
            log.exception("driver error reading heartbeats")
        finally:
            if self._poll is not None:
                self._next = asyncio.get_running_loop().call_later(self.tick, self._look)

    def _take_ready(self) -> None:
        assert self._poll is not None and self._socket is not None
        listening = self._socket.fileno()
        while True:
            ready = self._poll.poll(0, 1024)
            for fd, _ in ready:
                if fd == listening:
                    self._accept()
                elif (connection := self._connections.get(fd)) is not None:
                    self._read(connection)
            if len(ready) < 1024:
                return

    def _accept(self) -> None:
        assert self._socket is not None and self._poll is not None
        while True:
            try:
                sock, address = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of descriptors, say: the worker tries again
                log.warning("cannot accept a heartbeat connection: %s", err)
                return
            sock.setblocking(False)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            connection = _Connection(sock, str(address[0]), self._ssl is not None)
            self._connections[sock.fileno()] = connection
            self._strangers[sock.fileno()] = connection
            self._poll.register(sock.fileno(), _READ)
            self._read(connection)  # a hello may be there already

    def _read(self, connection: _Connection) -> None:
        """Read all `connection` has (until the socket would block: a TLS socket may hold
        decrypted data that epoll does not announce) and act on its whole frames."""
        sock, ended = connection.sock, False
        try:
            if not connection.shaken:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                connection.shaken = True
            while data := sock.recv(_CHUNK):
                connection.received += data
            ended = True  # the worker closed it
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # nothing more for now
        except OSError:  # reset, or a failed TLS handshake
            ended = True
        try:
            for body in take_frames(connection.received):
                if not self._take(connection, body):
                    return
        except FrameError as err:
            self._refuse(connection, "INVALID_ARGUMENT", str(err))
            return
        if ended:
            self._close(connection)

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
            self._strangers.pop(connection.sock.fileno(), None)
            return True
        self._refuse(connection, "INVALID_ARGUMENT", f"unexpected frame kind {body[0]} here")
        return False

    def _refuse(self, connection: _Connection, code: str, details: str) -> None:
        # A few bytes: there is room for them. If not, the worker reconnects and hears it again.
        with contextlib.suppress(OSError, ValueError):
            connection.sock.send(refused_frame(code, details))
        self._close(connection)

    def _close_strangers(self, opened_before: float) -> None:
        for connection in list(self._strangers.values()):
            if connection.opened < opened_before:
                self._close(connection)

    def _close(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        if fd < 0:
            return
        self._connections.pop(fd, None)
        self._strangers.pop(fd, None)
        if self._poll is not None:
            with contextlib.suppress(OSError):
                self._poll.unregister(fd)
        connection.sock.close()
