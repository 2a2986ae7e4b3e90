"""Simulated workers for driver benchmarks: the real driver, workers without torch.

A simulated worker does on the wire what `elastic.worker.runtime.init` and the elastic run loop
do, with the worker's own timeouts, retries and gRPC channel options: gRPC `Register` (job token
as `authorization: Bearer ...`), the `Events` stream (opened, and accepted by the driver, before
joining; reopened with a backoff when it ends), heartbeats on the port that stream names (one
every heartbeat interval: the epoch it is in, commit 0; reconnected with a backoff), and
round 1 from its launch (`first_round`: its slot was in its environment) or
`POST /v1/rendezvous/join` until `formed`. On `EpochBroken` of its epoch (or a
`HostsUpdated` that carries it) or `HostsUpdated` to a newer one it joins again with
`after_epoch` = its epoch at once (a real worker does so at its next collective or commit):
it takes the slot a
`HostsUpdated` carried, waiting up to `OFFER_WAIT` for one after `EpochBroken`, as
`elastic.worker.runtime` does, and joins over HTTP only without one. No process group, no
torch.

Many simulated workers share one asyncio process (`python -m
bench.support.simulated_workers`), each with its own gRPC channel (no shared subchannel) and its own
keep-alive HTTP connection, as separate processes would have: the driver sees one gRPC and one HTTP
connection per worker. The HTTP side is a minimal HTTP/1.1 client (`HttpConnection`) that keeps
httpx's 5 s keep-alive expiry: the driver parses the same requests, and the client processes, which
share the machine with the driver, spend far less CPU than httpx would.

The client process reads commands on stdin and writes reports on stdout, one JSON object a
line (reports are batched every 10 ms; each carries the CLOCK_MONOTONIC time of what it reports,
comparable across processes):

* `{"op": "start", "worker_id", "driver_url", "control_address", "token"}`: start one
  (after `delay` seconds, if given: a real worker's interpreter and imports take a while);
* `{"op": "kill", "ids": [...]}`: those workers die as a SIGKILLed process does: heartbeats
  stop, the gRPC channel and the HTTP connection close at once; answered by
  `{"ev": "killed", "ids", "t"}` once all are closed;
* `{"op": "stop", "id"}` (the driver stopped it) -> `{"ev": "stopped", "id"}`;
  `{"op": "stop_all"}` -> `{"ev": "stopped_all", "n"}`; `{"op": "exit"}`.

Reports: `{"ev": "formed", "id", "epoch", "t"}` (received its slot), `{"ev": "told", "id",
"epoch", "t"}` (learnt that `epoch`, its own, is over: the first such event's arrival),
`{"ev": "evicted", "id", "t"}` (the driver answered NOT_FOUND: it declared the worker dead;
a real worker exits), `{"ev": "left", "id"}` (`not_member`), `{"ev": "error", "id", "error"}`,
`{"ev": "retry", "id", "what"}` (a call failed and is tried again: which, and why).

The driver side of these processes is `simulated_job`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench.support.child_processes import raise_open_files_limit

RETRY_FOR_S = 60.0  # how long a worker retries a call that fails transiently
JOIN_POLL_S = 30.0  # one join long-poll (`DriverClient.join`)
HTTP_KEEPALIVE_EXPIRY_S = 5.0  # httpx drops a connection idle this long before reusing it
REPORT_EVERY_S = 0.01
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 2.0  # `elastic.worker.driver_link.retries.bounded_retries`

Report = Callable[[dict[str, Any]], None]
Command = dict[str, Any]


# --- the client process: simulated workers ---------------------------------------------------


class HttpError(Exception):
    """The driver answered 5xx or the connection failed: retried like the worker's client."""


class HttpConnection:
    """One keep-alive HTTP/1.1 connection to the driver, opened on demand.

    Like the worker's httpx client it reconnects when the server closed the connection (the
    driver's idle timeout, or its connection limit making room) and does not reuse one idle
    for longer than `HTTP_KEEPALIVE_EXPIRY_S`. Every failure raises `HttpError`.
    """

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._head = (
            f"Host: {parts.netloc}\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
            f"Connection: keep-alive\r\nUser-Agent: python-httpx/0.28.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._idle_since = 0.0

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path`; (status, body) of the answer within `timeout` s."""
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(path, body)
        except (OSError, EOFError, TimeoutError, ValueError, asyncio.IncompleteReadError) as err:
            self.abort()
            raise HttpError(f"{type(err).__name__}: {err}") from err

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        stale = time.monotonic() - self._idle_since > HTTP_KEEPALIVE_EXPIRY_S
        if self._reader is None or self._reader.at_eof() or stale:
            self.abort()
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None and self._writer is not None
        self._writer.write(
            b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self._head, len(body), body)
        )
        status_line = await self._reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, close = 0, False
        while (line := await self._reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        content = await self._reader.readexactly(length)
        if close:
            self.abort()
        self._idle_since = time.monotonic()
        return status, content

    def abort(self) -> None:
        """Drop the connection at once (as the kernel does for a killed process)."""
        if self._writer is not None:
            self._writer.transport.abort()
        self._reader = self._writer = None


class Backoff:
    """The worker's retry schedule: 50 ms doubling to 2 s, each wait jittered as the worker's
    (`elastic.worker.driver_link.retries.jittered`), for up to `RETRY_FOR_S` in all."""

    def __init__(self) -> None:
        self._deadline = time.monotonic() + RETRY_FOR_S
        self._next = BACKOFF_FIRST_S

    async def wait(self, error: BaseException) -> None:
        """Sleep before the next attempt; re-raise `error` when the budget is spent."""
        from elastic.worker.driver_link.retries import jittered

        wait = jittered(self._next)
        if time.monotonic() + wait > self._deadline:
            raise error
        await asyncio.sleep(wait)
        self._next = min(2 * self._next, BACKOFF_MAX_S)


async def _refusal(reader: asyncio.StreamReader) -> str | None:
    """The status name of the driver's refusal on a heartbeat connection; None when it closes
    the connection without one."""
    from elastic.protocol.beats import REFUSED, FrameError, parse_refused, take_frames

    received = bytearray()
    with contextlib.suppress(ConnectionError, FrameError):
        while data := await reader.read(4096):
            received += data
            for body in take_frames(received):
                if body[0] == REFUSED:
                    return parse_refused(body)[0]
    return None


class Evicted(Exception):
    """The driver answered NOT_FOUND: it declared this worker dead."""


class SimWorker:
    """One simulated worker: register, open the event stream, heartbeat, join rounds."""

    def __init__(self, spec: Command, report: Report) -> None:
        from grpc import aio

        from elastic.protocol import control_pb2_grpc as pb_grpc
        from elastic.worker.driver_link.control_client import CHANNEL_OPTIONS

        self.worker_id: str = spec["worker_id"]
        self._delay: float = spec.get("delay", 0.0)  # the process' start-up before init()
        self._report = report
        self._metadata = (("authorization", f"Bearer {spec['token']}"),)
        # Each worker is its own process in reality: its own connection, no shared subchannel.
        self._channel = aio.insecure_channel(
            spec["control_address"],
            options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)],
        )
        self._stub = pb_grpc.ControlStub(self._channel)
        self._http = HttpConnection(spec["driver_url"], spec["token"])
        self._token: str = spec["token"]
        self._control_host = spec["control_address"].rpartition(":")[0].strip("[]")
        self._beat_port = 0  # named by the driver on the event stream
        self._beat_port_known = asyncio.Event()
        self._interval = 1.0
        self.epoch = 0
        self._broken = 0  # newest EpochBroken epoch seen
        self._update = 0  # newest HostsUpdated next_epoch seen
        self._offer = 0  # newest epoch a HostsUpdated gave this worker a slot in
        self._offered = asyncio.Event()
        self._first_round: bool = spec.get("first_round", False)
        self._told_at: float | None = None  # when the current epoch was first announced over
        self._wake = asyncio.Event()
        self._stream_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.main: asyncio.Task[None] | None = None
        self._stopped = False
        self._closing: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.main = asyncio.create_task(self._run())
        self.main.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """The worker's life ended: it left the job (`not_member`), was evicted, or failed."""
        if not task.cancelled():
            self._end(task.exception())

    async def _run(self) -> None:
        from elastic.protocol import control_pb2 as pb
        from elastic.worker.driver_link.control_client import CALL_TIMEOUT

        await asyncio.sleep(self._delay)
        answer = await self._call(
            self._stub.Register,
            pb.RegisterRequest(worker_id=self.worker_id, pid=os.getpid()),
            timeout=CALL_TIMEOUT,
        )
        self._interval = answer.heartbeat_interval or 1.0
        self._spawn(self._heartbeats())
        self._spawn(self._events())
        async with asyncio.timeout(RETRY_FOR_S):
            await self._stream_ready.wait()  # the driver accepted it: no event is missed
        while await self._enter():
            while not self._epoch_over():
                self._wake.clear()
                await self._wake.wait()
            told = self._told_at if self._told_at is not None else time.monotonic()
            self._report({"ev": "told", "id": self.worker_id, "epoch": self.epoch, "t": told})
        self._report({"ev": "left", "id": self.worker_id})

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        task.add_done_callback(self._finished)  # they end only by an eviction (or a bug)
        self._tasks.append(task)

    def _end(self, error: BaseException | None) -> None:
        """Report why the worker ends (unless it was stopped) and stop it, as its process
        would exit."""
        if self._stopped:
            return
        if isinstance(error, Evicted):
            self._report({"ev": "evicted", "id": self.worker_id, "t": time.monotonic()})
        elif error is not None:
            frames = traceback.extract_tb(error.__traceback__)
            where = ", ".join(f.name for f in frames if "bench" in f.filename) or "?"
            what = f"{where}: {type(error).__name__}: {error}"
            self._report({"ev": "error", "id": self.worker_id, "error": what[:300]})
        self._stop_now()

    def _epoch_over(self) -> bool:
        return self._broken >= self.epoch or self._update > self.epoch

    def _retrying(self, what: str) -> None:
        """Report one failed attempt that is tried again (`what`: the call and why)."""
        self._report({"ev": "retry", "id": self.worker_id, "what": what})

    async def _call(self, method: Any, request: Any, timeout: float) -> Any:
        """A unary call, retried like the worker's on transient codes (CANCELLED among them:
        the gRPC client cancels calls waiting on a connection it gave up); NOT_FOUND:
        `Evicted`. Each retry is reported (`retry`, "<call> <code>")."""
        import grpc

        from elastic.worker.driver_link.control_client import RETRYABLE_CODES

        retryable = RETRYABLE_CODES  # the worker's own list
        backoff = Backoff()
        name = getattr(method, "_method", b"call").decode().rpartition("/")[2]
        while True:
            try:
                return await method(request, metadata=self._metadata, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                code = err.code()
                if code == grpc.StatusCode.NOT_FOUND:
                    raise Evicted(self.worker_id) from err
                if code not in retryable:
                    raise
                self._retrying(f"{name} {code.name}")
                await backoff.wait(err)

    async def _enter(self) -> bool:
        """Enter the first round after `self.epoch` as the worker does: from its launch
        environment (round 1), from an offered slot, else by `_join`."""
        from elastic.worker.driver_link.membership_events import OFFER_WAIT

        if self.epoch == 0 and self._first_round:
            return self._formed(1)
        if self._offer <= self.epoch and self.epoch and self._broken >= self.epoch:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OFFER_WAIT):
                    while self._offer <= self.epoch:
                        self._offered.clear()
                        await self._offered.wait()
        if self._offer > self.epoch:
            return self._formed(self._offer)
        return await self._join()

    def _formed(self, epoch: int) -> bool:
        self.epoch = epoch
        now = time.monotonic()
        self._report({"ev": "formed", "id": self.worker_id, "epoch": self.epoch, "t": now})
        self._told_at = now if self._epoch_over() else None
        return True

    async def _join(self) -> bool:
        """Join the first round after `self.epoch`; False when told to leave the job."""
        body = {
            "worker_id": self.worker_id,
            "after_epoch": self.epoch,
            "pid": os.getpid(),
            "timeout": JOIN_POLL_S,
            "commit": 0,
        }
        backoff = Backoff()
        while True:
            try:
                status, content = await self._http.post(
                    "/v1/rendezvous/join", json.dumps(body).encode(), JOIN_POLL_S + 10.0
                )
                if status >= 500:
                    raise HttpError(f"HTTP {status}")
            except HttpError as err:
                self._retrying(f"join {str(err).partition(':')[0]}")
                await backoff.wait(err)
                continue
            if status >= 400:
                raise RuntimeError(f"join refused: {status} {content[:200]!r}")
            answer = json.loads(content)
            if answer["status"] == "formed":
                return self._formed(answer["epoch"])
            if answer["status"] == "not_member":
                return False
            backoff = Backoff()  # pending: poll again

    async def _heartbeats(self) -> None:
        """Send one beat every heartbeat interval (the worker's schedule) to the heartbeat
        port the event stream named (`elastic.protocol.beats`); connect again with the
        worker's backoff when the connection ends. A refusal NOT_FOUND: `Evicted`."""
        from elastic.protocol.beats import beat_frame, hello_frame
        from elastic.worker.driver_link.retries import Backoff as StreamBackoff

        hello = hello_frame(self._token, self.worker_id)
        backoff = StreamBackoff()
        while True:
            await self._beat_port_known.wait()
            try:
                reader, writer = await asyncio.open_connection(self._control_host, self._beat_port)
            except OSError as err:
                self._retrying(f"heartbeats {type(err).__name__}")
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            refused = asyncio.create_task(_refusal(reader))
            try:
                writer.write(hello)
                next_beat = time.monotonic()
                while not refused.done():
                    writer.write(beat_frame(self.epoch, 0))
                    next_beat = max(next_beat + self._interval, time.monotonic())
                    await asyncio.wait({refused}, timeout=next_beat - time.monotonic())
                code = refused.result()
                if code == "NOT_FOUND":
                    raise Evicted(self.worker_id)
                self._retrying(f"heartbeats {code or 'closed'}")
            finally:
                refused.cancel()
                writer.transport.abort()
            await asyncio.sleep(backoff.next())

    async def _events(self) -> None:
        """Consume the event stream; reopen it with the worker's backoff when it ends."""
        import grpc

        from elastic.protocol import control_pb2 as pb
        from elastic.worker.driver_link.retries import Backoff as StreamBackoff

        backoff = StreamBackoff()
        while True:
            call = self._stub.Events(
                pb.EventsRequest(worker_id=self.worker_id), metadata=self._metadata
            )
            try:
                headers = dict(await call.initial_metadata() or ())
                if not call.done():
                    backoff.reset()
                    self._aim_heartbeats(headers)
                    self._stream_ready.set()
                async for event in call:
                    self._deliver(event)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    raise Evicted(self.worker_id) from err
                self._retrying(f"Events {err.code().name}")
            await asyncio.sleep(backoff.next())

    def _aim_heartbeats(self, headers: dict[str, Any]) -> None:
        from elastic.protocol.beats import BEAT_PORT_KEY

        if (port := headers.get(BEAT_PORT_KEY)) is not None:
            self._beat_port = int(port)
            self._beat_port_known.set()

    def _deliver(self, event: Any) -> None:
        kind = event.WhichOneof("kind")
        if kind == "epoch_broken":
            self._broken = max(self._broken, event.epoch_broken.epoch)
        elif kind == "hosts_updated":  # it may also break a round, as `EpochBroken` does
            self._broken = max(self._broken, event.hosts_updated.broken_epoch)
            self._update = max(self._update, event.hosts_updated.next_epoch)
            if event.hosts_updated.HasField("slot"):
                self._offer = max(self._offer, event.hosts_updated.next_epoch)
                self._offered.set()
        if self._told_at is None and self.epoch and self._epoch_over():
            self._told_at = time.monotonic()
        self._wake.set()

    def _stop_now(self) -> None:
        """Everything ends at once: tasks cancelled, connections dropped (no goodbye)."""
        if self._stopped:
            return
        self._stopped = True
        for task in [*self._tasks, *([self.main] if self.main else [])]:
            task.cancel()
        self._http.abort()
        # Cancels the stream and the calls in flight and closes the connection.
        self._closing = asyncio.get_running_loop().create_task(self._channel.close(grace=None))

    async def stop(self) -> None:
        """Die now, as a SIGKILLed worker process does; returns once its sockets are closed."""
        self._stop_now()
        tasks = [*self._tasks, *([self.main] if self.main else []), self._closing]
        await asyncio.gather(*tasks, return_exceptions=True)


class ReportWriter:
    """Reports to stdout, batched: at most one write every `REPORT_EVERY_S`."""

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._out = sys.stdout

    def __call__(self, doc: dict[str, Any]) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_later(REPORT_EVERY_S, self.flush)
        self._pending.append(json.dumps(doc))

    def flush(self) -> None:
        if self._pending:
            self._out.write("\n".join(self._pending) + "\n")
            self._out.flush()
            self._pending = []


async def serve_clients() -> None:
    """The client process: commands on stdin, one JSON object a line; reports on stdout."""
    raise_open_files_limit()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    report = ReportWriter()
    sims: dict[str, SimWorker] = {}

    async def kill(ids: list[str]) -> None:
        doomed = [sims.pop(i) for i in ids if i in sims]
        await asyncio.gather(*(s.stop() for s in doomed), return_exceptions=True)
        report({"ev": "killed", "ids": ids, "t": time.monotonic()})

    while line := await reader.readline():
        command = json.loads(line)
        op = command["op"]
        if op == "start":
            sim = SimWorker(command, report)
            sims[sim.worker_id] = sim
            sim.start()
        elif op == "kill":
            loop.create_task(kill(command["ids"]))
        elif op == "stop":
            if (sim := sims.pop(command["id"], None)) is not None:
                await sim.stop()
            report({"ev": "stopped", "id": command["id"]})
        elif op == "stop_all":
            doomed, sims = list(sims.values()), {}
            await asyncio.gather(*(s.stop() for s in doomed), return_exceptions=True)
            report({"ev": "stopped_all", "n": len(doomed)})
        elif op == "exit":
            break
    report.flush()


if __name__ == "__main__":
    asyncio.run(serve_clients())
