"""The worker's side of the gRPC control protocol: register, heartbeats, the event stream.

Plain threads, no asyncio: one daemon thread sends the heartbeats (`heartbeats.py`, to the
port the driver names on the event stream), one consumes the driver's event stream and
records what it announces in the process's `MembershipEvents`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from elastic.errors import ElasticError
from elastic.protocol import control_pb2 as pb
from elastic.protocol import control_pb2_grpc as pb_grpc
from elastic.protocol.beats import BEAT_PORT_KEY, Activity
from elastic.protocol.env import AUTH_SCHEME
from elastic.protocol.http import SlotInfo
from elastic.protocol.leave import EXITING, FINISHED
from elastic.worker.driver_link.heartbeats import BeatSender, BeatTarget
from elastic.worker.driver_link.locator import DriverLocator
from elastic.worker.driver_link.membership_events import HostsUpdate, MembershipEvents, Offer
from elastic.worker.driver_link.retries import BACKOFF_MAX, Backoff, Outage, bounded_retries
from elastic.worker.driver_link.transport import control_channel
from elastic.worker.exit import exit_now

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")

# The exit status of a worker the driver declared dead (default `on_evicted`).
EXIT_EVICTED = 1

# Codes after which a call may succeed if tried again: the driver is away, restarting, or
# failed transiently. Any other code is an answer. CANCELLED, when this client did not cancel
# the call itself: gRPC cancels a call whose connection it gave up (a driver too busy to finish
# handshakes, thousands of workers starting at once), and `_relocate` closes the old channel.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)

CHANNEL_OPTIONS = [
    # Notice a driver host that vanished without closing its sockets within ~20 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnect to a restarted driver within 2 s (gRPC's default backoff grows to 120 s); gRPC
    # spreads each wait by +-20 % itself, so workers that lost the driver together disperse.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # The least time a connection attempt is given (gRPC's name notwithstanding, not a
    # backoff; default 20 s): at 100 ms, a driver busy with thousands of workers' handshakes
    # saw them given up and restarted, again and again. A driver host that vanished is
    # noticed by keep-alive and by the calls' own deadlines, not by this.
    ("grpc.min_reconnect_backoff_ms", 5_000),
    # No bandwidth probing: control messages are tiny, and each probe is a ping the driver
    # answers.
    ("grpc.http2.bdp_probe", 0),
    # Control messages are tiny.
    ("grpc.max_receive_message_length", 1024 * 1024),
]

# Seconds one Register or Leave attempt may take. Long enough for a driver that thousands of
# workers call at once to answer (10,000 Register calls at once: 7.3 s on a 2-core machine);
# an attempt that times out is queued again behind all the others.
CALL_TIMEOUT = 15.0
EXIT_NOTICE_FOR = 2.0  # seconds an exiting worker spends telling the driver, at most
STREAM_BACKOFF_MAX = BACKOFF_MAX  # seconds between attempts to reopen a stream, at most


class ControlError(ElasticError, RuntimeError):
    """The driver refused a control call, or stayed unreachable past the retry budget."""


class WorkerEvicted(ControlError):
    """The driver answered NOT_FOUND: it declared this worker dead (or never knew it)."""


def exit_evicted() -> None:
    """The default `on_evicted`: log, flush the standard streams, `os._exit(EXIT_EVICTED)`.

    A hard exit, because the driver already counts this worker out: its round was broken and
    the survivors re-form without it; a worker that lingered (in a blocked collective, in a
    `finally`, in atexit handlers joining threads) would be a member nobody waits for."""
    log.error("the driver declared this worker dead: exiting with status %d", EXIT_EVICTED)
    exit_now(EXIT_EVICTED)


def _code(err: BaseException) -> grpc.StatusCode | None:
    return err.code() if isinstance(err, grpc.RpcError) else None  # type: ignore[attr-defined]


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError):
        return f"{err.code().name}: {err.details()}"  # type: ignore[attr-defined]
    return repr(err)


def _retryable(err: BaseException) -> bool:
    return _code(err) in RETRYABLE_CODES


class ControlClient:
    """One worker process's control connection to the driver at `address` ("host:port").

    `start()` registers (retrying for up to `retry_for` seconds, with a jittered backoff),
    starts the heartbeat and event threads, and returns once the driver has accepted the event
    stream. Heartbeats go to the heartbeat port the driver names in the response headers of the
    event stream, one every heartbeat interval (`BeatSender`). While the driver is away
    (crashed, restarting, partitioned) both threads keep reconnecting forever, with a
    jittered backoff up to 2 s; the outage is logged once when it starts and once when it
    ends (a driver that hangs without closing its connections is noticed by keep-alive,
    within about 20 s). When the driver answers
    NOT_FOUND to a heartbeat or to opening the event stream, it has declared this worker dead:
    the threads stop and `on_evicted()` is called once, from a background thread (default
    `exit_evicted`: the process exits at once with status 1). `start` and `leave` raise
    `WorkerEvicted` instead (`on_evicted` is not called for a NOT_FOUND met while `start`
    runs). A refused token (UNAUTHENTICATED) after `start` is logged and retried like an
    outage: a restarted driver of the same job accepts it again. Heartbeats carry the round
    last given to `set_round` (0 before).
    """

    def __init__(
        self,
        address: str,
        token: str,
        worker_id: str,
        events: MembershipEvents,
        heartbeat_interval_fallback: float = 1.0,
        *,
        on_evicted: Callable[[], None] = exit_evicted,
        retry_for: float = 60.0,
        tls_cert: bytes | None = None,
        locator: DriverLocator | None = None,
        activity: Callable[[], Activity] = Activity,
    ) -> None:
        self.address = address
        self._activity = activity
        self.worker_id = worker_id
        self._events = events
        self._token = token
        self._metadata = (("authorization", f"{AUTH_SCHEME} {token}"),)
        self._heartbeat_interval = heartbeat_interval_fallback
        self._on_evicted = on_evicted
        self._retry_for = retry_for
        self._tls_cert = tls_cert
        self._locator = locator
        self._channel = control_channel(address, tls_cert, CHANNEL_OPTIONS)
        self._stub = pb_grpc.ControlStub(self._channel)
        self._round = 0
        self._commit = 0
        self._durable = (0, False)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._evicted = False
        self._starting = True  # evictions are raised by start(), not given to on_evicted
        self._stream_ready = threading.Event()  # set once a stream is open, or on eviction
        self._stream: Any = None  # the open Events call, cancelled by close()
        self._beats: BeatSender | None = None  # made once the driver names the interval
        self._threads: list[threading.Thread] = []

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats: the driver's answer to Register, else the fallback."""
        return self._heartbeat_interval

    def set_round(self, round_: int) -> None:
        """The round this worker is in; the next heartbeats carry it."""
        with self._lock:
            self._round = round_

    @property
    def commit(self) -> int:
        """The commit count last given to `set_commit` (0 before)."""
        with self._lock:
            return self._commit

    def set_commit(self, commit: int) -> None:
        """How many state commits this worker has made; the next heartbeats carry it."""
        with self._lock:
            self._commit = commit

    def set_durable(self, written: int, stale: bool) -> None:
        """The newest commit this worker wrote durably, and whether its last write failed;
        the next heartbeats carry them (the driver reports a stale durable copy)."""
        with self._lock:
            self._durable = written, stale

    def start(self) -> None:
        """Register, start the heartbeat and event-stream threads, and wait until the driver
        has accepted the event stream (so no event sent after `start` returns is missed).

        Raises `WorkerEvicted` on NOT_FOUND, `ControlError` on any other refusal or when the
        driver stays unreachable for `retry_for` seconds, at registration or while the stream
        opens; the client is closed then."""
        try:
            answer = self._call(
                "Register", pb.RegisterRequest(worker_id=self.worker_id, pid=os.getpid())
            )
        except ControlError:
            self.close()
            raise
        if answer.heartbeat_interval > 0:
            self._heartbeat_interval = answer.heartbeat_interval
        self._beats = BeatSender(
            self._token,
            self.worker_id,
            self._heartbeat_interval,
            self._progress,
            self._evicted_by_driver,
            self._stop,
        )
        for name, target in (("heartbeats", self._beats.run), ("events", self._read_events)):
            thread = threading.Thread(target=target, name=f"elastic-control-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        atexit.register(self.close)
        ready = self._stream_ready.wait(self._retry_for)
        with self._lock:
            self._starting = False
            evicted = self._evicted
        if evicted or not ready:
            self.close()
            if evicted:
                raise WorkerEvicted(f"the driver declared worker {self.worker_id} dead")
            raise ControlError(
                f"driver at {self.address} did not open the event stream of worker "
                f"{self.worker_id} within {self._retry_for:g} s"
            )

    def leave(self, reason: str) -> None:
        """Ask the driver to let this worker leave at its next commit (no rollback, no
        cooldown). Retries for up to `retry_for` seconds; raises `WorkerEvicted` on NOT_FOUND
        and `ControlError` on any other refusal or when the driver stays unreachable."""
        self._call(
            "Leave", pb.LeaveRequest(worker_id=self.worker_id, reason=reason, commit=self.commit)
        )

    def notice(self, leaving_at: float) -> None:
        """Tell the driver that this worker's host goes at `leaving_at` (Unix seconds): it
        lets the host's workers go at their next step and launches none there before then.
        Tries for at most `EXIT_NOTICE_FOR` seconds and never raises (this worker leaves
        anyway; the driver learns of the host from its workers' exits)."""
        request = pb.NoticeRequest(worker_id=self.worker_id, leaving_at=leaving_at)
        try:
            self._call("Notice", request, retry_for=EXIT_NOTICE_FOR)
        except ControlError as err:
            log.warning("the driver did not take this host's preemption notice: %s", err)

    def report_unreachable(self, round: int, ranks: set[int]) -> None:
        """Tell the driver that the peers of `ranks` in round `round` answer no probe. Tries
        for at most `EXIT_NOTICE_FOR` seconds and never raises (a driver that is away learns
        it again from the next probe)."""
        request = pb.UnreachableRequest(worker_id=self.worker_id, round=round, ranks=sorted(ranks))
        try:
            self._call("Unreachable", request, retry_for=EXIT_NOTICE_FOR)
        except ControlError as err:
            log.debug("could not tell the driver of unreachable peers: %s", err)

    def say_exiting(self, finished: bool) -> None:
        """Tell the driver this process is exiting (`finished`: its script returned), so it
        is judged by its exit code and not by heartbeats while it exits. Tries for at most
        `EXIT_NOTICE_FOR` seconds and never raises: nothing may hold up an exit. Does
        nothing once the client is closed."""
        if self._stop.is_set():
            return
        reason = FINISHED if finished else EXITING
        try:
            self._call(
                "Leave",
                pb.LeaveRequest(worker_id=self.worker_id, reason=reason, commit=self.commit),
                retry_for=EXIT_NOTICE_FOR,
            )
        except ControlError as err:  # the driver may be gone, or already counts this out
            log.debug("could not tell the driver this worker exits: %s", err)

    @property
    def closed(self) -> threading.Event:
        """Set once `close` runs: threads that live as long as this client wait on it (they
        never set it)."""
        return self._stop

    def close(self) -> None:
        """Stop both threads and close the channel: returns within about a second whatever
        state the driver is in. Idempotent; also runs at interpreter exit."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        self._channel.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)
        atexit.unregister(self.close)

    def _relocate(self) -> bool:
        """The driver is unreachable: if it now serves elsewhere or with another certificate
        (a restarted driver published its new address in etcd), connect there and return
        True. The old channel is closed, which ends calls still waiting on it."""
        if self._locator is None:
            return False
        self._locator.refresh()
        address = self._locator.control_address
        cert = self._locator.tls_cert or self._tls_cert  # a restarted driver's, MAC verified
        with self._lock:
            if self._stop.is_set() or (address == self.address and cert == self._tls_cert):
                return False
            self._tls_cert = cert
            old, self._channel = (
                self._channel,
                control_channel(address, self._tls_cert, CHANNEL_OPTIONS),
            )
            self._stub = pb_grpc.ControlStub(self._channel)
            self.address = address
        old.close()
        return True

    def _call(self, method_name: str, request: Any, retry_for: float | None = None) -> Answer:
        """One unary call with tenacity retries of transient failures for `retry_for` s
        (default: the client's)."""
        budget = self._retry_for if retry_for is None else retry_for

        def retryable(err: BaseException) -> bool:
            return _retryable(err) and not self._stop.is_set()  # close() cancels, not gRPC

        retrying = bounded_retries(budget, retryable, moved=self._relocate)
        timeout = min(CALL_TIMEOUT, max(budget, 0.5))  # one attempt fits a short budget
        try:
            for attempt in retrying:
                with attempt:
                    method = getattr(self._stub, method_name)
                    return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            code, details = _code(err), err.details()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.NOT_FOUND:
                raise WorkerEvicted(f"the driver declared worker {self.worker_id} dead") from err
            if code in RETRYABLE_CODES:
                raise ControlError(
                    f"driver at {self.address} unreachable for {budget:g} s: {details}"
                ) from err
            raise ControlError(f"driver at {self.address} refused: {code}: {details}") from err
        except ValueError as err:  # grpc's "Cannot invoke RPC on closed channel!"
            raise ControlError(f"the control client of {self.worker_id} is closed") from err
        raise AssertionError("unreachable")  # pragma: no cover

    def _evicted_by_driver(self) -> None:
        """Called from a background thread on NOT_FOUND: stop everything, then `on_evicted`
        once (unless `start` is still running: it raises instead)."""
        with self._lock:
            if self._evicted or self._stop.is_set():
                return
            self._evicted = True
            starting = self._starting
            stream = self._stream
        log.error("the driver declared worker %s dead", self.worker_id)
        self._stop.set()
        if stream is not None:
            stream.cancel()
        self._stream_ready.set()
        if not starting:
            self._on_evicted()

    def _read_events(self) -> None:
        """Consume the event stream; reopen it with a backoff whenever it ends, until
        `close()` or NOT_FOUND."""
        outage = Outage(f"event stream of worker {self.worker_id}")
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                call = self._stub.Events(
                    pb.EventsRequest(worker_id=self.worker_id), metadata=self._metadata
                )
            except ValueError:  # the channel was closed: we stop, or moved to a new driver
                if self._stop.is_set():
                    return
                self._stop.wait(backoff.next())
                continue
            with self._lock:
                self._stream = call
            if self._stop.is_set():  # close() ran before the call was visible to it
                call.cancel()
                return
            try:
                # Blocks until the driver accepts or refuses the stream.
                headers = call.initial_metadata()
                if not call.done():
                    outage.succeeded()
                    backoff.reset()
                    self._aim_heartbeats(headers)
                    self._stream_ready.set()
                for event in call:
                    self._deliver(event)
                # Ended with OK: the driver is stopping; a new one may come.
                log.info("the driver closed the event stream of worker %s", self.worker_id)
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return
                if _code(err) == grpc.StatusCode.NOT_FOUND:
                    self._evicted_by_driver()
                    return
                outage.failed(_describe(err))
                if self._relocate():
                    backoff.reset()  # a new driver: try it at once
                    continue
            finally:
                with self._lock:
                    self._stream = None
            self._stop.wait(backoff.next())

    def _progress(self) -> tuple[int, int, int, bool, Activity]:
        """What a heartbeat carries: the round, the commit count, the newest durable commit
        written, whether the last durable write failed, and what the process is doing."""
        with self._lock:
            return self._round, self._commit, *self._durable, self._activity()

    def _aim_heartbeats(self, headers: Any) -> None:
        """Send the heartbeats where the response headers of an accepted event stream say."""
        port = dict(headers or ()).get(BEAT_PORT_KEY)
        if port is None or not str(port).isdigit():
            log.error("the driver at %s named no heartbeat port (an older driver?)", self.address)
            return
        with self._lock:
            host, cert = self.address.rpartition(":")[0].strip("[]"), self._tls_cert
        assert self._beats is not None
        self._beats.aim(BeatTarget(host, int(port), cert))

    def _deliver(self, event: pb.Event) -> None:
        """Record `event` in the `MembershipEvents`. A `HostsUpdated` that carries a broken
        round (the wire's `broken_epoch`) counts as an `EpochBroken` event of that round too,
        recorded after the slot it offers and before the update. (The wire's `epoch` fields
        and the `EpochBroken` message keep their old names: each is a round.)"""
        kind = event.WhichOneof("kind")
        if kind == "hosts_updated":
            update = event.hosts_updated
            if update.HasField("slot"):  # before the update: whoever acts on it finds the slot
                slot = update.slot
                self._events.offer(
                    Offer(
                        update.next_epoch,
                        SlotInfo(
                            hostname=slot.hostname,
                            rank=slot.rank,
                            local_rank=slot.local_rank,
                            cross_rank=slot.cross_rank,
                            size=slot.size,
                            local_size=slot.local_size,
                            cross_size=slot.cross_size,
                        ),
                        update.job_commit,
                    )
                )
            if update.broken_epoch:  # after the slot: a collective it aborts finds the slot
                self._events.break_round(update.broken_epoch, update.broken_reason)
            if update.leave:  # let go: it leaves at its next step boundary, as on SIGTERM
                self._events.request_leave()
            self._events.hosts_updated(
                HostsUpdate(
                    update.next_epoch, added=bool(update.added), removed=bool(update.removed)
                )
            )
        elif kind == "epoch_broken":
            broken = event.epoch_broken
            self._events.break_round(broken.epoch, broken.reason, broken.rejoin)
        else:  # an event kind newer than this worker
            log.debug("ignoring an unknown control event %s", kind)
