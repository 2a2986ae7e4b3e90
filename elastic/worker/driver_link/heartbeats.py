"""The worker's heartbeats: a beat to the driver's heartbeat port every heartbeat interval,
from one daemon thread, on a plain socket (`elastic.protocol.beats`)."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from elastic.errors import ElasticError
from elastic.protocol.beats import (
    REFUSED,
    FrameError,
    beat_frame,
    hello_frame,
    parse_refused,
    take_frames,
)
from elastic.worker.driver_link.retries import Backoff, Outage
from elastic.worker.driver_link.transport import pinned_ssl_context

CONNECT_TIMEOUT = 5.0  # seconds to connect (and with TLS, shake hands), at most
SEND_TIMEOUT = 5.0  # seconds one beat may wait for room in the socket before it reconnects
POLL = 0.2  # seconds between looks at `stop` and at a new target while waiting
# Linux's TCP_THIN_LINEAR_TIMEOUTS (linux/tcp.h; Python names no constant for it): a
# connection with few packets in flight retransmits at a fixed interval instead of doubling
# it. A beat lost in a short partition then goes again within ~0.2 s of the link's return,
# not after a back-off of seconds that outlasts the missed-heartbeat allowance.
TCP_THIN_LINEAR_TIMEOUTS = 16


@dataclass(frozen=True)
class BeatTarget:
    """Where the driver takes heartbeats: its host, its heartbeat port, and with TLS the
    certificate to pin."""

    host: str
    port: int
    cert: bytes | None = None


class BeatRefused(ElasticError, ConnectionError):
    """The driver refused a heartbeat: `code` is a gRPC status name (NOT_FOUND: it counts
    this worker out)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code


class BeatSender:
    """Sends one worker's heartbeats from the thread that calls `run`.

    Nothing is sent until `aim` names a target (the driver names its heartbeat port on each
    event stream it accepts). A connection opens with a hello (the job token, the worker id),
    then carries a beat (`progress()`: round, commit count) every `interval` seconds. When a
    connection fails, the driver closes it, or refuses a beat for any reason but NOT_FOUND,
    the sender connects again with a jittered backoff, logging the outage once and its end;
    a new target is tried at once. On NOT_FOUND (the driver counts this worker out)
    `on_evicted()` is called and `run` returns. `run` returns within `POLL` s of `stop`.
    """

    def __init__(
        self,
        token: str,
        worker_id: str,
        interval: float,
        progress: Callable[[], tuple[int, int]],
        on_evicted: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        self._hello = hello_frame(token, worker_id)
        self.worker_id = worker_id
        self._interval = interval
        self._progress = progress
        self._on_evicted = on_evicted
        self._stop = stop
        self._changed = threading.Condition()
        self._target: BeatTarget | None = None

    def aim(self, target: BeatTarget) -> None:
        """Send the heartbeats to `target` from now on (a new target: at once)."""
        with self._changed:
            if target != self._target:
                self._target = target
                self._changed.notify_all()

    def run(self) -> None:
        outage = Outage(f"heartbeats of worker {self.worker_id}")
        backoff = Backoff()
        while (target := self._wait(None, None)) is not None:
            try:
                with self._connect(target) as sock:
                    sock.sendall(self._hello + beat_frame(*self._progress()))
                    outage.succeeded()
                    backoff.reset()
                    self._beat(sock, target)
                continue  # stopped, or aimed elsewhere: connect there at once
            except BeatRefused as err:
                if err.code == "NOT_FOUND":
                    self._on_evicted()
                    return
                outage.failed(str(err))
            except (OSError, FrameError) as err:
                outage.failed(f"{type(err).__name__}: {err}")
            self._wait(target, backoff.next())

    def _wait(self, current: BeatTarget | None, timeout: float | None) -> BeatTarget | None:
        """Wait up to `timeout` s (None: for a target) while the target is `current`; the
        target then, None once `stop` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._stop.is_set():
                left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if (self._target != current or left <= 0) and self._target is not None:
                    return self._target
                self._changed.wait(max(left, 0.001))
        return None

    @contextlib.contextmanager
    def _connect(self, target: BeatTarget) -> Iterator[socket.socket]:
        sock = socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):  # not Linux: the default back-off
                sock.setsockopt(socket.IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1)
            if target.cert is not None:
                context = pinned_ssl_context(target.cert)
                sock = context.wrap_socket(sock, server_hostname=target.host)
            sock.settimeout(SEND_TIMEOUT)
            yield sock
        finally:
            sock.close()

    def _beat(self, sock: socket.socket, target: BeatTarget) -> None:
        """Beat on `sock` until `stop` or a new target; raises on a failure or a refusal."""
        received = bytearray()
        poller = select.poll()  # not select(): a training process may hold 1,024 descriptors
        poller.register(sock, select.POLLIN)
        next_beat = time.monotonic() + self._interval
        while not self._stop.is_set() and self._target == target:
            left = min(POLL, next_beat - time.monotonic())
            if left > 0:
                if poller.poll(left * 1000):
                    self._read(sock, received)
                continue
            sock.sendall(beat_frame(*self._progress()))
            next_beat = max(next_beat + self._interval, time.monotonic())

    @staticmethod
    def _read(sock: socket.socket, received: bytearray) -> None:
        """Take what the driver sent: it only ever sends a refusal before closing."""
        sock.settimeout(0)  # TLS: readable may mean a record with no data (a session ticket)
        try:
            data = sock.recv(4096)
        except (ssl.SSLWantReadError, BlockingIOError):  # nothing for us (yet)
            return
        finally:
            sock.settimeout(SEND_TIMEOUT)
        if not data:
            raise ConnectionError("the driver closed the heartbeat connection")
        received += data
        for body in take_frames(received):
            if body[0] == REFUSED:
                raise BeatRefused(*parse_refused(body))
