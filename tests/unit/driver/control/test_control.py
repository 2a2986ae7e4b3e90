"""The gRPC control service on a real loopback server, with real clients in this process and in
subprocesses; the driver's listener is a recording fake (the driver's own is tested elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from elastic.driver.control.events import ControlEvent, HostsUpdated, RoundBroken
from elastic.driver.control.heartbeat_port import BeatServer
from elastic.driver.control.server import ControlServer
from elastic.protocol import control_pb2 as pb
from elastic.protocol import control_pb2_grpc as pb_grpc
from elastic.protocol.beats import (
    BEAT_PORT_KEY,
    REFUSED,
    beat_frame,
    hello_frame,
    parse_refused,
    take_frames,
)
from elastic.protocol.http import SlotInfo
from elastic.worker.driver_link.control_client import ControlClient, ControlError, WorkerEvicted
from elastic.worker.driver_link.membership_events import HostsUpdate, MembershipEvents, Offer
from tests.support.loop_thread import Loop
from tests.support.paths import REPOSITORY as ROOT

TOKEN = "s3cret-control-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
INTERVAL = 0.1


class RecordingListener:
    """Records every call with its time; answers False for the worker ids in `unknown`."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.queues: dict[str, asyncio.Queue[ControlEvent]] = {}
        self.unknown: set[str] = set()
        self.refused_streams: set[str] = set()
        self.fail_heartbeats = False
        self.stall_once = 0.0  # seconds the next registration blocks the event loop
        self.stalled = threading.Event()  # set as that stall begins
        self._changed = threading.Condition()

    def _record(self, *call: Any) -> None:
        with self._changed:
            self.calls.append((*call, time.monotonic()))
            self._changed.notify_all()

    def registered(self, worker_id: str, pid: int) -> bool:
        stall, self.stall_once = self.stall_once, 0.0
        if stall:
            self.stalled.set()
            time.sleep(stall)  # a driver too busy to take calls for a while
        self._record("registered", worker_id, pid)
        return worker_id not in self.unknown

    def heartbeat(
        self,
        worker_id: str,
        round: int,
        commit: int = 0,
        durable: int = 0,
        stale: bool = False,
        activity: object = None,
    ) -> bool:
        if self.fail_heartbeats:
            raise RuntimeError("listener bug")
        self._record("heartbeat", worker_id, round, commit, durable, stale)
        return worker_id not in self.unknown

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        self._record("leave", worker_id, reason, commit)
        return worker_id not in self.unknown

    def unreachable(self, worker_id: str, round: int, ranks: frozenset[int]) -> bool:
        self._record("unreachable", worker_id, round, ranks)
        return worker_id not in self.unknown

    def stream_opened(self, worker_id: str) -> asyncio.Queue[ControlEvent] | None:
        self._record("stream_opened", worker_id)
        if worker_id in self.unknown or worker_id in self.refused_streams:
            return None
        self.queues[worker_id] = asyncio.Queue()
        return self.queues[worker_id]

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[ControlEvent]) -> None:
        self._record("stream_closed", worker_id)

    def of(self, kind: str, worker_id: str) -> list[tuple[Any, ...]]:
        with self._changed:
            return [c for c in self.calls if c[0] == kind and c[1] == worker_id]

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        """Wait until `done()` holds (checked at each recorded call); `what` names it in the
        failure."""
        with self._changed:
            ok = self._changed.wait_for(done, timeout=timeout)
        assert ok, f"not within {timeout} s: {what}: {self.calls}"

    def wait_for(
        self, kind: str, worker_id: str, count: int = 1, timeout: float = 10.0
    ) -> list[tuple[Any, ...]]:
        """The first `count` calls of `kind` by `worker_id`, waiting for them to arrive."""
        with self._changed:
            ok = self._changed.wait_for(
                lambda: len(self.of(kind, worker_id)) >= count, timeout=timeout
            )
        assert ok, f"no {count} {kind} calls of {worker_id} within {timeout} s: {self.calls}"
        return self.of(kind, worker_id)[:count]


class Driver:
    """A ControlServer on a free loopback port, served by an event loop in its own thread."""

    def __init__(self) -> None:
        self.listener = RecordingListener()
        self.placements: dict[tuple[str, int], tuple[SlotInfo, int]] = {}  # the slots it sends
        self.placing_for = 0.0  # seconds finding a slot takes (a durable backend saves first)
        self._loop = Loop()
        self.loop = self._loop.loop
        self.server = self.start()

    def run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return self._loop.run(coroutine, timeout)

    def start(self, port: int = 0) -> ControlServer:
        async def placement(worker_id: str, number: int) -> tuple[SlotInfo, int] | None:
            if self.placing_for:
                await asyncio.sleep(self.placing_for)
            return self.placements.get((worker_id, number))

        server = ControlServer(
            self.listener, TOKEN, "127.0.0.1", port, heartbeat_interval=INTERVAL,
            placement=placement,
        )  # fmt: skip
        self.run(server.start())
        self.server = server
        return server

    def send(self, worker_id: str, event: ControlEvent) -> None:
        self.loop.call_soon_threadsafe(self.listener.queues[worker_id].put_nowait, event)

    def close(self) -> None:
        self.run(self.server.stop(0))
        self._loop.close()


@pytest.fixture
def driver() -> Iterator[Driver]:
    running = Driver()
    yield running
    running.close()


@pytest.fixture
def clients() -> Iterator[list[ControlClient]]:
    """ControlClients to close after the test."""
    started: list[ControlClient] = []
    yield started
    for client in started:
        client.close()


def wait_until(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)
    return value


def start_client(
    driver: Driver, clients: list[ControlClient], worker_id: str, **kwargs: Any
) -> tuple[ControlClient, MembershipEvents]:
    events = MembershipEvents()
    client = ControlClient(driver.server.address, TOKEN, worker_id, events, **kwargs)
    clients.append(client)
    client.start()
    return client, events


CLIENT_PROCESS = """
import sys, time
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.membership_events import MembershipEvents
client = ControlClient(sys.argv[1], sys.argv[2], sys.argv[3], MembershipEvents())
client.start()
print("registered", flush=True)
sys.stdin.readline()  # the test says when to exit (returning normally, not closing the client)
"""


def client_process(driver: Driver, worker_id: str) -> subprocess.Popen[str]:
    """A worker process with a started ControlClient; it prints "registered" once `start`
    returned, and returns from its script (without closing the client) on a line on stdin."""
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT_PROCESS, driver.server.address, TOKEN, worker_id],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_register_and_heartbeats_reach_the_listener_at_the_interval(
    driver: Driver, clients: list[ControlClient]
) -> None:
    client, _ = start_client(driver, clients, "w1", heartbeat_interval_fallback=5.0)
    assert client.heartbeat_interval == INTERVAL  # the driver's answer wins over the fallback
    (registered,) = driver.listener.wait_for("registered", "w1")
    assert registered[2] == os.getpid()

    beats = driver.listener.wait_for("heartbeat", "w1", count=6)
    gaps = [b[-1] - a[-1] for a, b in zip(beats, beats[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    print(f"heartbeat interval {INTERVAL} s, measured mean gap {mean:.3f} s")
    assert INTERVAL * 0.5 < mean < INTERVAL * 3

    client.set_round(7)
    wait_until(lambda: any(b[2] == 7 for b in driver.listener.of("heartbeat", "w1")))
    client.set_commit(5)
    client.leave("drained")  # with its commit count: it may hold the newest one
    assert driver.listener.of("leave", "w1")[0][2:4] == ("drained", 5)


def test_unreachable_peers_reach_the_listener_and_bad_reports_are_refused(
    driver: Driver, clients: list[ControlClient]
) -> None:
    client, _ = start_client(driver, clients, "w1")
    client.report_unreachable(3, {2, 0})
    assert driver.listener.wait_for("unreachable", "w1")[0][2:4] == (3, frozenset({0, 2}))
    with grpc.insecure_channel(driver.server.address) as channel:
        stub = pb_grpc.ControlStub(channel)
        metadata = [("authorization", f"Bearer {TOKEN}")]
        for request in (
            pb.UnreachableRequest(worker_id="w1", round=-1, ranks=[0]),
            pb.UnreachableRequest(worker_id="w1", round=3, ranks=[-4]),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Unreachable(request, metadata=metadata, timeout=5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(driver.listener.of("unreachable", "w1")) == 1
    # A worker the driver counts out is told so; the report never raises.
    driver.listener.unknown.add("w1")
    client.report_unreachable(3, {1})
    assert len(driver.listener.of("unreachable", "w1")) == 2


def test_events_arrive_in_membership_events(driver: Driver, clients: list[ControlClient]) -> None:
    _, events = start_client(driver, clients, "w1")
    driver.listener.wait_for("stream_opened", "w1")
    driver.send("w1", HostsUpdated(version=3, next_round=4, added=("h2",)))
    assert wait_until(lambda: events.pending_update(3)) == HostsUpdate(4, True, False)
    driver.send("w1", RoundBroken(round=4, reason="h2 died"))
    assert wait_until(lambda: events.broken(4)) == "h2 died"
    driver.send("w1", HostsUpdated(version=4, next_round=5, removed=("h2",)))
    # a worker still in round 3 moves past both: it gains and loses workers
    fifth = wait_until(lambda: (u := events.pending_update(3)) is not None and u.next_round == 5)
    assert fifth and events.pending_update(3) == HostsUpdate(5, True, True)
    # one in round 4 only loses some: round 4's joiners are no news to it
    assert events.pending_update(4) == HostsUpdate(5, False, True)
    assert not events.leaving
    driver.send("w1", HostsUpdated(version=5, next_round=6, removed=("h1",), leave=True))
    assert wait_until(lambda: events.leaving), "let go: it leaves at its next step boundary"


def test_a_break_that_calls_the_worker_back_has_it_join_at_once(
    driver: Driver, clients: list[ControlClient]
) -> None:
    """After a plain break the worker waits for its slot on the stream; after one that calls
    it back (`rejoin`) it joins over HTTP at once: the next round waits for it."""
    _, events = start_client(driver, clients, "w1")
    driver.listener.wait_for("stream_opened", "w1")
    assert not events.slot_follows(3), "an unbroken round: nothing follows"
    driver.send("w1", RoundBroken(round=3, reason="h2 died"))
    assert wait_until(lambda: events.broken(3)) == "h2 died"
    assert events.slot_follows(3)
    driver.send("w1", RoundBroken(round=4, reason="h3 died", rejoin=True))
    assert wait_until(lambda: events.broken(4)) == "h3 died"
    assert not events.slot_follows(4) and not events.slot_follows(3)
    driver.send("w1", RoundBroken(round=5, reason="h4 died"))
    assert wait_until(lambda: events.broken(5)) == "h4 died"
    assert events.slot_follows(5), "a call back holds for its round, not for later ones"


def test_a_new_round_brings_the_workers_slot_in_it_when_the_driver_gives_one(
    driver: Driver, clients: list[ControlClient]
) -> None:
    _, events = start_client(driver, clients, "w1")
    driver.listener.wait_for("stream_opened", "w1")
    slot = SlotInfo(
        hostname="h1", rank=2, local_rank=0, cross_rank=2, size=3, local_size=1, cross_size=3
    )
    driver.placements[("w1", 4)] = (slot, 7)
    driver.send("w1", RoundBroken(round=3, reason="h2 died"))
    driver.send("w1", HostsUpdated(version=3, next_round=4, removed=("h2",)))
    assert events.offer_after(3, wait=10.0) == Offer(4, slot, job_commit=7)
    assert events.offer_after(4) is None, "no newer round offered yet"
    driver.send("w1", HostsUpdated(version=4, next_round=5, added=("h3",)))  # no slot given
    # a grow after a shrink is a grow to a worker in round 4 (it was taken as a shrink too,
    # and a sharded state then waited for its commit's replication: 4 s at ~98M parameters)
    assert wait_until(lambda: events.pending_update(4)) == HostsUpdate(5, True, False)
    assert events.offer_after(4) is None, "without a slot the worker joins over HTTP"
    assert events.offer_after(3) == Offer(4, slot, job_commit=7)


class NeverDone:
    """A collective blocked on a hung peer: every wait slice times out, as Gloo's does."""

    def wait(self, timeout: Any = None) -> bool:
        time.sleep(0.01)
        raise RuntimeError("Operation timed out!")


def test_a_new_round_that_breaks_the_old_one_aborts_a_blocked_collective(
    driver: Driver, clients: list[ControlClient]
) -> None:
    """One `HostsUpdated` carrying the broken round does what `RoundBroken` does (the blocked
    collective gives up) and brings the slot, so the survivor needs no HTTP join."""
    import torch

    from elastic.worker import context
    from elastic.worker.collectives.handles import wait as _wait
    from elastic.worker.errors import WorkerLostError

    _, events = start_client(driver, clients, "w1")
    driver.listener.wait_for("stream_opened", "w1")
    slot = SlotInfo(
        hostname="h1", rank=0, local_rank=0, cross_rank=0, size=2, local_size=1, cross_size=2
    )
    driver.placements[("w1", 4)] = (slot, 7)
    here = SlotInfo(
        hostname="h1", rank=1, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=3
    )
    ctx = context.WorkerContext(
        slot=here,
        round=3,
        group=None,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        events=events,
        timeout=10.0,  # a collective that is never aborted fails the test, not hangs it
    )
    context.activate(ctx)
    try:
        update = HostsUpdated(
            version=3, next_round=4, removed=("h0",), broken_round=3, broken_reason="h0 died"
        )
        driver.loop.call_soon_threadsafe(
            driver.loop.call_later, 0.2, driver.listener.queues["w1"].put_nowait, update
        )  # while the collective below is blocked
        with pytest.raises(WorkerLostError, match="round 3 is broken: h0 died"):
            _wait(NeverDone())  # type: ignore[arg-type]
    finally:
        context.activate(None)
    assert events.offer_after(3) == Offer(4, slot, job_commit=7)
    assert events.pending_update(3) == HostsUpdate(4, False, True)


@contextlib.contextmanager
def event_stream(driver: Driver, worker_id: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    """`worker_id`'s event stream as the driver accepted it, and its response headers;
    cancelled and its channel closed on leaving."""
    with grpc.insecure_channel(driver.server.address) as channel:
        stream = pb_grpc.ControlStub(channel).Events(
            pb.EventsRequest(worker_id=worker_id), metadata=AUTH
        )
        try:
            yield stream, dict(stream.initial_metadata())
        finally:
            stream.cancel()


def test_a_new_round_that_breaks_the_old_one_is_one_message_on_the_wire(driver: Driver) -> None:
    slot = SlotInfo(
        hostname="h1", rank=0, local_rank=0, cross_rank=0, size=2, local_size=1, cross_size=2
    )
    driver.placements[("w1", 4)] = (slot, 7)
    with event_stream(driver, "w1") as (stream, _):
        driver.send("w1", HostsUpdated(3, 4, broken_round=3, broken_reason="h0 died"))
        driver.send("w1", RoundBroken(4, "h1 died"))  # the next message
        first, second = next(stream), next(stream)
    update = first.hosts_updated
    assert (update.next_epoch, update.broken_epoch, update.broken_reason) == (4, 3, "h0 died")
    assert update.slot.rank == 0 and update.job_commit == 7
    assert second.epoch_broken.epoch == 4


def test_a_slow_slot_does_not_hold_up_the_word_that_a_round_is_broken(driver: Driver) -> None:
    """A durable backend saves the new round before its slots are sent: while that takes
    long, the break goes out on its own first, then the slot."""
    slot = SlotInfo(
        hostname="h1", rank=0, local_rank=0, cross_rank=0, size=2, local_size=1, cross_size=2
    )
    driver.placements[("w1", 4)] = (slot, 7)
    driver.placing_for = 1.0
    with event_stream(driver, "w1") as (stream, _):
        driver.send("w1", HostsUpdated(3, 4, broken_round=3, broken_reason="h0 died"))
        first, second = next(stream), next(stream)
    assert (first.epoch_broken.epoch, first.epoch_broken.reason) == (3, "h0 died")
    update = second.hosts_updated
    assert update.next_epoch == 4 and update.broken_epoch == 0 and update.slot.rank == 0


def test_a_killed_client_process_closes_its_stream_promptly(driver: Driver) -> None:
    process = client_process(driver, "doomed")
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "registered"
        driver.listener.wait_for("stream_opened", "doomed")
        assert not driver.listener.of("stream_closed", "doomed")
        killed = time.monotonic()
        os.kill(process.pid, signal.SIGKILL)
        (closed,) = driver.listener.wait_for("stream_closed", "doomed", timeout=10)
        print(f"stream_closed {closed[-1] - killed:.3f} s after SIGKILL")
        assert closed[-1] - killed < 5
    finally:
        process.kill()
        process.wait()


def test_a_client_process_exits_without_closing_its_client(driver: Driver) -> None:
    """The daemon threads and the channel do not hold up interpreter exit."""
    process = client_process(driver, "quitter")
    try:
        stdout, _ = process.communicate("exit\n", timeout=20)
        assert stdout.strip() == "registered"
        assert process.returncode == 0
        driver.listener.wait_for("stream_closed", "quitter")
    finally:
        process.kill()
        process.wait()


def test_default_eviction_exits_the_process(driver: Driver) -> None:
    process = client_process(driver, "zombie")
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "registered"
        driver.listener.unknown.add("zombie")
        assert process.wait(timeout=10) == 1
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    "metadata",
    [None, [("authorization", "Bearer wrong")], [("authorization", TOKEN)], [("x", TOKEN)]],
)
def test_calls_without_the_token_are_refused(
    driver: Driver, metadata: list[tuple[str, str]] | None
) -> None:
    with grpc.insecure_channel(driver.server.address) as channel:
        stub = pb_grpc.ControlStub(channel)
        calls: list[tuple[Any, Any]] = [
            (stub.Register, pb.RegisterRequest(worker_id="w", pid=1)),
            (stub.Leave, pb.LeaveRequest(worker_id="w", reason="r")),
            (stub.Unreachable, pb.UnreachableRequest(worker_id="w", round=1, ranks=[0])),
            (lambda r, **kw: list(stub.Events(r, **kw)), pb.EventsRequest(worker_id="w")),
            (channel.unary_unary("/elastic.control.v1.Control/Nothing"), b""),
        ]
        for call, request in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call(request, metadata=metadata, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert TOKEN not in (refused.value.details() or "")
    assert driver.listener.calls == []
    # The server still serves the right token afterwards.
    with grpc.insecure_channel(driver.server.address) as channel:
        answer = pb_grpc.ControlStub(channel).Register(
            pb.RegisterRequest(worker_id="w", pid=1),
            metadata=[("authorization", f"Bearer {TOKEN}")],
            timeout=5,
        )
    assert answer.heartbeat_interval == INTERVAL


class BeatConnection:
    """A raw connection to the driver's heartbeat port, written frame by frame by the test."""

    def __init__(self, driver: Driver, worker_id: str | None = None, token: str = TOKEN) -> None:
        self.sock = socket.create_connection(("127.0.0.1", driver.server.beat_port), timeout=10)
        self._received = bytearray()
        if worker_id is not None:
            self.send(hello_frame(token, worker_id))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def beat(self, round_: int = 0, commit: int = 0) -> None:
        self.send(beat_frame(round_, commit))

    def refusal(self) -> tuple[str, str] | None:
        """The REFUSED frame the driver sends before it closes; None if it closes without
        (a reset too)."""
        while data := self._recv():
            self._received += data
            for body in take_frames(self._received):
                assert body[0] == REFUSED, body
                return parse_refused(body)
        return None

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(4096)
        except ConnectionResetError:
            return b""

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def connections() -> Iterator[list[BeatConnection]]:
    opened: list[BeatConnection] = []
    yield opened
    for connection in opened:
        connection.close()


def test_the_heartbeat_port_reports_every_beat_in_order(
    driver: Driver, connections: list[BeatConnection]
) -> None:
    connections.append(one := BeatConnection(driver, "w1"))
    for round_ in (1, 2, 3):
        one.beat(round_, commit=10 * round_)
        driver.listener.wait_for("heartbeat", "w1", count=round_)
    # Frames cut anywhere by TCP are put together again.
    connections.append(two := BeatConnection(driver))
    for byte in hello_frame(TOKEN, "w2") + beat_frame(4, 40):
        two.send(bytes([byte]))
    driver.listener.wait_for("heartbeat", "w2")
    heard = [c[2:4] for c in driver.listener.of("heartbeat", "w1")]
    assert heard == [(1, 10), (2, 20), (3, 30)]
    assert driver.listener.of("heartbeat", "w2")[0][2:4] == (4, 40)


def test_a_beat_of_a_worker_the_driver_counts_out_is_refused_not_found(
    driver: Driver, connections: list[BeatConnection]
) -> None:
    connections.append(beats := BeatConnection(driver, "w1"))
    beats.beat(1)
    driver.listener.wait_for("heartbeat", "w1")
    driver.listener.unknown.add("w1")  # declared dead
    beats.beat(1)
    assert beats.refusal() == ("NOT_FOUND", "no live worker 'w1'")
    assert len(driver.listener.of("heartbeat", "w1")) == 2


@pytest.mark.parametrize(
    ("frames", "listener_fails", "code"),
    [
        ([hello_frame("wrong", "w1"), beat_frame(1, 0)], False, "UNAUTHENTICATED"),
        ([hello_frame("", "w1")], False, "UNAUTHENTICATED"),
        ([hello_frame(TOKEN, ""), beat_frame(1, 0)], False, "INVALID_ARGUMENT"),
        ([hello_frame(TOKEN, "w" * 999)], False, "INVALID_ARGUMENT"),
        ([beat_frame(1, 0)], False, "INVALID_ARGUMENT"),  # a beat before the hello
        ([hello_frame(TOKEN, "w1"), hello_frame(TOKEN, "w2")], False, "INVALID_ARGUMENT"),
        ([b"\x00\x00"], False, "INVALID_ARGUMENT"),  # an empty frame
        ([b"\xff\xff" + bytes(100)], False, "INVALID_ARGUMENT"),  # longer than allowed
        ([b"\x00\x03H\x00\x09"], False, "INVALID_ARGUMENT"),  # a string cut short
        ([hello_frame(TOKEN, "w1"), b"\x00\x01B"], False, "INVALID_ARGUMENT"),  # a cut beat
        ([hello_frame(TOKEN, "w1"), beat_frame(1, 0)], True, "UNAVAILABLE"),  # listener bug
    ],
)
def test_a_frame_the_driver_cannot_take_is_refused_and_the_connection_closed(
    driver: Driver,
    connections: list[BeatConnection],
    frames: list[bytes],
    listener_fails: bool,
    code: str,
) -> None:
    driver.listener.fail_heartbeats = listener_fails
    connections.append(beats := BeatConnection(driver))
    beats.send(b"".join(frames))
    refused = beats.refusal()
    assert refused is not None and refused[0] == code
    assert TOKEN not in refused[1]
    assert beats.refusal() is None, "closed after the refusal"
    if code != "UNAVAILABLE":
        assert driver.listener.of("heartbeat", "w1") == []
    # The port still serves good connections.
    driver.listener.fail_heartbeats = False
    connections.append(good := BeatConnection(driver, "w3"))
    good.beat(2)
    driver.listener.wait_for("heartbeat", "w3")


def test_a_connection_that_never_says_hello_is_closed() -> None:
    async def main() -> bytes:
        listener = RecordingListener()
        server = BeatServer(listener, TOKEN, "127.0.0.1", hello_within=0.2)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            started = time.monotonic()
            data = await asyncio.wait_for(reader.read(), timeout=10)  # EOF when closed
            assert time.monotonic() - started < 5
            writer.close()
            return data
        finally:
            await server.stop()

    assert asyncio.run(main()) == b"", "closed without a word"


def test_stopping_the_server_closes_heartbeat_connections_at_once(
    driver: Driver, connections: list[BeatConnection]
) -> None:
    connections.append(beats := BeatConnection(driver, "w1"))
    beats.beat()
    driver.listener.wait_for("heartbeat", "w1")
    driver.run(driver.server.stop(grace=60), timeout=20)
    started = time.monotonic()
    assert beats.refusal() is None  # closed (the worker reconnects), not refused
    assert time.monotonic() - started < 5


def test_the_event_stream_names_the_heartbeat_port(driver: Driver) -> None:
    with event_stream(driver, "w1") as (_, headers):
        pass
    assert headers[BEAT_PORT_KEY] == str(driver.server.beat_port)


class CancellingDriver(pb_grpc.ControlServicer):
    """A control service (sync gRPC server on loopback) that answers its first `cancel`
    Register calls CANCELLED, as gRPC does for a call whose connection it gave up; it accepts
    the event stream and sends no event."""

    def __init__(self, cancel: int) -> None:
        self.cancel = cancel
        self.registrations = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ControlServicer_to_server(self, self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def Register(self, request: Any, context: Any) -> pb.RegisterResponse:  # noqa: N802
        self.registrations += 1
        if self.registrations <= self.cancel:
            context.abort(grpc.StatusCode.CANCELLED, "the connection was given up")
        return pb.RegisterResponse(heartbeat_interval=INTERVAL)

    def Events(self, request: Any, context: Any) -> Iterator[pb.Event]:  # noqa: N802
        context.send_initial_metadata(())
        while context.is_active():
            time.sleep(0.05)
        yield from ()

    def stop(self) -> None:
        self._server.stop(0)


def test_a_cancelled_register_is_retried(clients: list[ControlClient]) -> None:
    """At 10,000 workers starting at once, Register calls ended CANCELLED and every such
    worker failed to start; now it tries again, within its retry budget."""
    cancelling = CancellingDriver(cancel=2)
    try:
        client = ControlClient(cancelling.address, TOKEN, "w1", MembershipEvents())
        clients.append(client)
        client.start()
        assert cancelling.registrations == 3
        assert client.heartbeat_interval == INTERVAL
    finally:
        cancelling.stop()


def test_cancelled_registers_are_retried_for_the_budget_only(clients: list[ControlClient]) -> None:
    cancelling = CancellingDriver(cancel=1_000_000)
    try:
        client = ControlClient(cancelling.address, TOKEN, "w1", MembershipEvents(), retry_for=0.5)
        clients.append(client)
        with pytest.raises(ControlError, match="unreachable for 0.5 s"):
            client.start()
        assert cancelling.registrations > 1
    finally:
        cancelling.stop()


def test_thousands_of_calls_arriving_while_the_driver_is_busy_are_all_served(
    driver: Driver,
) -> None:
    """Calls that arrive while the event loop is busy wait in gRPC's queue. With gRPC's
    default limits (1,000, then 3,000 waiting) it refused them, as CANCELLED: thousands of
    workers starting at once registered again and again."""
    calls, channels = 3_500, 35

    async def register_all() -> Counter[str]:
        from grpc import aio

        opened = [aio.insecure_channel(driver.server.address) for _ in range(channels)]
        stubs = [pb_grpc.ControlStub(channel) for channel in opened]
        await stubs[0].Register(pb.RegisterRequest(worker_id="w", pid=1), metadata=AUTH)
        driver.listener.stall_once = 2.0
        stalling = asyncio.ensure_future(
            stubs[0].Register(pb.RegisterRequest(worker_id="stall", pid=1), metadata=AUTH)
        )
        while not driver.listener.stalled.is_set():  # from now on, calls queue in gRPC
            await asyncio.sleep(0.01)

        async def one(index: int) -> str:
            stub = stubs[index % channels]
            request = pb.RegisterRequest(worker_id=f"w{index}", pid=1)
            try:
                await stub.Register(request, metadata=AUTH, timeout=60)
            except aio.AioRpcError as err:
                return err.code().name
            return "OK"

        codes = Counter(await asyncio.gather(*(one(i) for i in range(calls))))
        await stalling
        for channel in opened:
            await channel.close()
        return codes

    codes = asyncio.run(register_all())
    assert codes == Counter({"OK": calls})


def test_not_found_evicts_the_worker(driver: Driver, clients: list[ControlClient]) -> None:
    # Refused at registration: start() raises.
    driver.listener.unknown.add("never")
    with pytest.raises(WorkerEvicted):
        start_client(driver, clients, "never")

    # Declared dead later: the heartbeat's NOT_FOUND calls on_evicted once.
    evicted = threading.Event()
    start_client(driver, clients, "w1", on_evicted=evicted.set)
    driver.listener.wait_for("heartbeat", "w1")
    driver.listener.unknown.add("w1")
    assert evicted.wait(10)

    # Refused the event stream while starting: start() raises.
    driver.listener.refused_streams.add("w2")
    with pytest.raises(WorkerEvicted):
        start_client(driver, clients, "w2")

    # Refused the event stream later (by a restarted driver): on_evicted.
    evicted_too = threading.Event()
    start_client(driver, clients, "w3", on_evicted=evicted_too.set)
    driver.listener.refused_streams.add("w3")
    port = driver.server.port
    driver.run(driver.server.stop(0))
    driver.start(port)
    assert evicted_too.wait(10)


def test_the_client_survives_a_driver_restart(
    driver: Driver, clients: list[ControlClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="elastic.worker")
    client, events = start_client(driver, clients, "w1")
    driver.listener.wait_for("stream_opened", "w1")
    port = driver.server.port
    driver.run(driver.server.stop(0))
    # Stopping ends the stream: the listener hears of it.
    driver.listener.wait_for("stream_closed", "w1")
    beats = len(driver.listener.of("heartbeat", "w1"))
    time.sleep(0.5)  # the driver is away for a while: the client keeps trying, quietly

    driver.start(port)
    driver.listener.wait_for("stream_opened", "w1", count=2)
    driver.listener.wait_for("heartbeat", "w1", count=beats + 2)
    driver.send("w1", RoundBroken(round=1, reason="after restart"))
    assert wait_until(lambda: events.broken(1)) == "after restart"
    # One warning per thread when the outage began, one when it ended: no log line per retry.
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in w for w in warnings) == 2, warnings
    wait_until(lambda: sum("reachable again" in r.getMessage() for r in caplog.records) == 2)

    # close() is prompt even with the driver gone.
    driver.run(driver.server.stop(0))
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 2


def test_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in ("control_pb2.py", "control_pb2.pyi", "control_pb2_grpc.py"):
        committed = (ROOT / "elastic" / "protocol" / name).read_text()
        assert (tmp_path / name).read_text() == committed, (
            f"elastic/protocol/{name} is stale: run `python protos/generate.py`"
        )
