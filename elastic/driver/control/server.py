"""The gRPC control service (grpc.aio), served on the driver's event loop beside the HTTP API.

It only translates: every call is reported to the driver's `WorkerListener`, and the events the
driver puts on a worker's queue are written down that worker's stream. Whether a worker is
alive is the listener's decision; this module tells it when a stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from grpc import aio

from elastic.driver.control.events import (
    ControlEvent,
    HostsUpdated,
    Placement,
    RoundBroken,
    WorkerListener,
)
from elastic.driver.control.heartbeat_port import BeatServer
from elastic.driver.control.port_limits import BeatPortLimits, GrpcPortLimits
from elastic.driver.control.refusals import refusal
from elastic.driver.server.tls import TlsIdentity
from elastic.protocol import control_pb2 as pb
from elastic.protocol import control_pb2_grpc as pb_grpc
from elastic.protocol.beats import BEAT_PORT_KEY
from elastic.protocol.env import AUTH_SCHEME
from elastic.protocol.http import SlotInfo

log = logging.getLogger(__name__)

MAX_REASON_LENGTH = 4096
MAX_UNREACHABLE = 65_536  # ranks in one Unreachable report (the message size bounds it too)
# Seconds a `HostsUpdated` that breaks a round waits for the worker's slot (a durable
# backend saves the round first) before the break is written on its own.
BREAK_HELD_FOR = 0.05

SERVER_OPTIONS = [
    # Fail on a port already taken instead of sharing it with another server.
    ("grpc.so_reuseport", 0),
    # Control messages are tiny: refuse anything large before parsing it.
    ("grpc.max_receive_message_length", 64 * 1024),
    # Ping idle connections so a worker host that vanished without closing its sockets
    # (power loss, partition) has its stream cancelled within ~20 s; missed heartbeats catch
    # it first.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Workers ping every 10 s to notice a vanished driver: allow it (gRPC's default allows one
    # ping per 5 min without data and then closes the connection with "too_many_pings").
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # No bandwidth probing: it pings a connection on the data it receives, which made each
    # message cost the driver a third more CPU (heartbeats on gRPC streams, 1,000 workers,
    # one message a second each: 155 us a message without, 235 us with).
    ("grpc.http2.bdp_probe", 0),
    # Calls that arrived while the event loop was busy wait in gRPC's queue until the service
    # takes them. Past 1,000 waiting gRPC began to refuse new ones, as CANCELLED, and past 3,000
    # all of them: thousands of workers starting at once registered again and again (10,000
    # Register calls at once on this 2-core machine: 16.5 s and ~35,000 CANCELLED; with room
    # for them, 7.3 s and none). Client deadlines and gRPC's 30 s limit on a call's wait still
    # bound how long one waits.
    ("grpc.server.max_pending_requests", 32_768),
    ("grpc.server.max_pending_requests_hard_limit", 65_536),
]


def event_to_proto(event: ControlEvent, placed: tuple[SlotInfo, int] | None = None) -> pb.Event:
    """The wire form of a driver event; `placed`: with a `HostsUpdated`, the worker's slot in
    its `next_round` and the job's newest commit count. The wire keeps the first names of
    the round fields (`next_epoch`, `broken_epoch`, `EpochBroken`)."""
    if isinstance(event, HostsUpdated):
        update = pb.HostsUpdated(
            version=event.version,
            next_epoch=event.next_round,
            added=list(event.added),
            removed=list(event.removed),
            broken_epoch=event.broken_round,
            broken_reason=event.broken_reason,
            leave=event.leave,
        )
        if placed is not None:
            slot, update.job_commit = placed
            update.slot.CopyFrom(pb.Slot(**slot.model_dump()))
        return pb.Event(hosts_updated=update)
    if isinstance(event, RoundBroken):
        broken = pb.EpochBroken(epoch=event.round, reason=event.reason, rejoin=event.rejoin)
        return pb.Event(epoch_broken=broken)
    raise TypeError(f"not a control event: {event!r}")


async def _place_breaking(
    context: aio.ServicerContext[Any, Any],
    placement: Placement,
    worker_id: str,
    event: HostsUpdated,
) -> tuple[HostsUpdated, tuple[SlotInfo, int] | None]:
    """The slot for a `HostsUpdated` that also breaks a round. The word that the round is
    broken must not wait on a slow save of the new round (a durable backend's, up to seconds):
    if the slot is not known within `BREAK_HELD_FOR`, a `RoundBroken` is written at once and
    the update goes on without the word. Returns the update to write and its slot."""
    placing = asyncio.ensure_future(placement(worker_id, event.next_round))
    try:
        done, _ = await asyncio.wait((placing,), timeout=BREAK_HELD_FOR)
        if not done:
            broken = RoundBroken(event.broken_round, event.broken_reason)
            await context.write(event_to_proto(broken))
            event = dataclasses.replace(event, broken_round=0, broken_reason="")
        return event, await placing
    finally:
        placing.cancel()  # the stream ended meanwhile (no-op once placed)


class TokenCheck(aio.ServerInterceptor):
    """Refuses every call (known method or not) that lacks `authorization: Bearer <token>`.

    The comparison takes constant time; the request body of a refused call is never parsed;
    each refused peer address is logged once.
    """

    def __init__(self, token: str) -> None:
        self._expected = f"{AUTH_SCHEME} {token}".encode()
        self._refused_peers: set[str] = set()

    def _authorized(self, metadata: tuple[Any, ...] | None) -> bool:
        given = b""
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                break
        return hmac.compare_digest(given, self._expected)

    async def _refuse(self, context: aio.ServicerContext[Any, Any]) -> NoReturn:
        peer, _, _ = context.peer().rpartition(":")  # "ipv4:127.0.0.1:5555" -> without port
        if peer not in self._refused_peers:
            self._refused_peers.add(peer)
            log.warning("refused an unauthenticated gRPC call from %s", peer or context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if self._authorized(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        refuse = self._refuse

        if handler is not None and handler.response_streaming:

            async def refuse_stream(request: bytes, context: Any) -> AsyncIterator[Any]:
                await refuse(context)
                yield  # pragma: no cover - makes this an async generator

            if handler.request_streaming:
                return grpc.stream_stream_rpc_method_handler(refuse_stream)
            return grpc.unary_stream_rpc_method_handler(refuse_stream)

        async def refuse_unary(request: bytes, context: Any) -> None:
            await refuse(context)

        if handler is not None and handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse_unary)
        return grpc.unary_unary_rpc_method_handler(refuse_unary)


class _ControlService(pb_grpc.ControlServicer):
    def __init__(
        self,
        listener: WorkerListener,
        heartbeat_interval: float,
        stopping: asyncio.Event,
        placement: Placement | None,
        beat_port: int,
    ) -> None:
        self._listener = listener
        self._placement = placement
        # Sent as each event stream opens: where this driver takes the worker's heartbeats.
        self._stream_headers = ((BEAT_PORT_KEY, str(beat_port)),)
        self._heartbeat_interval = heartbeat_interval
        self._stopping = stopping
        self._streams: set[asyncio.Task[Any]] = set()  # the handlers of open streams

    async def _call_listener(
        self, context: aio.ServicerContext[Any, Any], worker_id: str, report: Callable[[], bool]
    ) -> None:
        """Run `report` for `worker_id`; end the call as `refusal` says when it refuses."""
        if (refused := refusal(worker_id, report)) is not None:
            await context.abort(*refused)

    def _stream_opened(self) -> bool:
        """Count the running stream handler as open until `end_streams`; False when the
        server is stopping already (the handler then ends at once, with OK)."""
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        return not self._stopping.is_set()

    def end_streams(self) -> None:
        """The server stops: end every event stream with OK (its worker
        reconnects). Each handler is cancelled, and returns normally when `stopping` is set."""
        for task in list(self._streams):
            task.cancel()

    async def Register(  # noqa: N802 - gRPC method name
        self, request: pb.RegisterRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.RegisterResponse:
        await self._call_listener(
            context,
            request.worker_id,
            lambda: self._listener.registered(request.worker_id, request.pid),
        )
        return pb.RegisterResponse(heartbeat_interval=self._heartbeat_interval)

    async def Leave(  # noqa: N802
        self, request: pb.LeaveRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.LeaveResponse:
        if len(request.reason) > MAX_REASON_LENGTH:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason is too long")
        await self._call_listener(
            context,
            request.worker_id,
            lambda: self._listener.leave(request.worker_id, request.reason, request.commit),
        )
        return pb.LeaveResponse()

    async def Unreachable(  # noqa: N802
        self, request: pb.UnreachableRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.UnreachableResponse:
        ranks = frozenset(request.ranks)
        if len(ranks) > MAX_UNREACHABLE or any(rank < 0 for rank in ranks) or request.round < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad round or ranks")
        await self._call_listener(
            context,
            request.worker_id,
            lambda: self._listener.unreachable(request.worker_id, request.round, ranks),
        )
        return pb.UnreachableResponse()

    async def Notice(  # noqa: N802
        self, request: pb.NoticeRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.NoticeResponse:
        if math.isnan(request.leaving_at) or request.leaving_at <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "leaving_at is no time")
        await self._call_listener(
            context,
            request.worker_id,
            lambda: self._listener.notice(request.worker_id, request.leaving_at),
        )
        return pb.NoticeResponse()

    async def Events(  # noqa: N802
        self, request: pb.EventsRequest, context: aio.ServicerContext[Any, Any]
    ) -> None:
        """Write the worker's queued events until the client goes away (the RPC is cancelled:
        the kernel closes a dead process's connection at once) or the server stops (the
        stream then ends with OK). `stream_closed` is called whatever ends it."""
        worker_id = request.worker_id
        queue: asyncio.Queue[ControlEvent] | None = None

        def open_stream() -> bool:
            nonlocal queue
            queue = self._listener.stream_opened(worker_id)
            return queue is not None

        await self._call_listener(context, worker_id, open_stream)
        assert queue is not None
        try:
            if not self._stream_opened():
                return
            # Tell the client at once that its stream is open (it resets its backoff on this)
            # and where to send its heartbeats.
            await context.send_initial_metadata(self._stream_headers)
            placement = self._placement
            while True:  # one event, one write: no task or wait set per event
                event = await queue.get()
                placed = None
                if placement is not None and isinstance(event, HostsUpdated):
                    if event.broken_round:
                        event, placed = await _place_breaking(context, placement, worker_id, event)
                    else:
                        placed = await placement(worker_id, event.next_round)
                await context.write(event_to_proto(event, placed))
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                raise  # the client went away
        finally:
            self._streams.discard(asyncio.current_task())  # type: ignore[arg-type]
            try:
                self._listener.stream_closed(worker_id, queue)
            except Exception:
                log.exception("driver error closing the event stream of worker %s", worker_id)


class ControlServer:
    """The control service on `host:port` (port 0: a free one, known after `start`), and its
    heartbeat port (`BeatServer`, a free port on `host`, named to each worker in the response
    headers of its event stream).

    With `tls` both accept TLS connections only, presenting that identity.
    Every call needs `authorization: Bearer <token>` (else UNAUTHENTICATED). A listener
    answering False becomes NOT_FOUND; a listener raising becomes UNAVAILABLE (the worker
    retries). With `placement`, each `HostsUpdated` written to a worker carries the worker's
    slot in that round when `placement` gives one (the worker then needs no HTTP join); one
    that also breaks a round waits at most `BREAK_HELD_FOR` for it (see `_place_breaking`).
    Runs on the event loop that calls `start`.

    `grpc_limits` and `beat_limits` bound what peers hold on the two ports (connections,
    handshake and idle time; default: this process's share of its open-file limit, see
    `elastic.driver.control.port_limits`). A worker's event stream is never cut by them.
    """

    def __init__(
        self,
        listener: WorkerListener,
        token: str,
        host: str,
        port: int = 0,
        *,
        heartbeat_interval: float = 1.0,
        tls: TlsIdentity | None = None,
        placement: Placement | None = None,
        grpc_limits: GrpcPortLimits | None = None,
        beat_limits: BeatPortLimits | None = None,
    ) -> None:
        if not token:
            raise ValueError("the control service needs a job token")
        if heartbeat_interval <= 0:
            raise ValueError(f"heartbeat_interval must be positive, not {heartbeat_interval}")
        self._listener = listener
        self._token = token
        self.host = host
        self._requested_port = port
        self.heartbeat_interval = heartbeat_interval
        self._placement = placement
        self._credentials = tls.grpc_server_credentials() if tls is not None else None
        self.grpc_limits = grpc_limits if grpc_limits is not None else GrpcPortLimits()
        self._beats = BeatServer(
            listener,
            token,
            host,
            ssl_context=tls.server_ssl_context() if tls else None,
            limits=beat_limits,
        )
        self._server: aio.Server | None = None
        self._port: int | None = None
        self._stopping: asyncio.Event | None = None
        self._service: _ControlService | None = None

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before `start`."""
        if self._port is None:
            raise RuntimeError("the control server is not started")
        return self._port

    @property
    def beat_port(self) -> int:
        """The heartbeat port; raises RuntimeError before `start`."""
        return self._beats.port

    @property
    def address(self) -> str:
        """`host:port` as a gRPC target (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve. Raises RuntimeError when the address cannot be bound."""
        self._stopping = asyncio.Event()
        await self._beats.start()
        server = aio.server(
            interceptors=[TokenCheck(self._token)],
            options=[*SERVER_OPTIONS, *self.grpc_limits.options()],
        )
        self._service = _ControlService(
            self._listener,
            self.heartbeat_interval,
            self._stopping,
            self._placement,
            self._beats.port,
        )
        pb_grpc.add_ControlServicer_to_server(self._service, server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        target = f"{host}:{self._requested_port}"
        try:
            if self._credentials is not None:
                port = server.add_secure_port(target, self._credentials)
            else:
                port = server.add_insecure_port(target)
            if port == 0:  # older grpcio answers 0 instead of raising
                raise RuntimeError(f"cannot bind the control service to {target}")
            await server.start()
        except BaseException:
            await self._beats.stop()
            raise
        self._server, self._port = server, port

    async def stop(self, grace: float | None = 1.0) -> None:
        """End every event stream (they close with OK; `stream_closed` is called for each)
        and heartbeat connection, give unary calls in flight `grace` seconds, then cancel
        them. Idempotent."""
        if self._stopping is not None:
            self._stopping.set()
        await self._beats.stop()
        if self._service is not None:
            self._service.end_streams()
        if self._server is not None:
            server, self._server = self._server, None
            with contextlib.suppress(asyncio.CancelledError):
                await server.stop(grace)
