"""The heartbeat protocol's frames, and the worker's `BeatSender` against the driver's real
`BeatServer` on loopback."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator

import pytest

from elastic.driver.control.heartbeat_port import BeatServer
from elastic.protocol.beats import (
    MAX_FRAME,
    Activity,
    FrameError,
    beat_frame,
    hello_frame,
    parse_beat,
    parse_hello,
    parse_refused,
    refused_frame,
    take_frames,
)
from elastic.worker.driver_link.heartbeats import BeatSender, BeatTarget
from tests.support.loop_thread import Loop
from tests.unit.driver.control.test_control import RecordingListener

TOKEN = "beats-token"


def test_frames_read_back_as_written_whole_or_in_pieces() -> None:
    doing = Activity(7, 224, 3.5, 1.25, -1.0, 12, "allgather", 0.5)
    stream = hello_frame(TOKEN, "h1[0]#1") + beat_frame(3, 41, 40, True, doing)
    stream += refused_frame("NOT_FOUND", "x")
    buffer = bytearray()
    bodies: list[bytes] = []
    for byte in stream:  # TCP may cut anywhere
        buffer.append(byte)
        bodies += take_frames(buffer)
    assert buffer == b""
    hello, beat, refused = bodies
    assert parse_hello(hello) == (TOKEN, "h1[0]#1")
    assert parse_beat(beat) == (3, 41, 40, True, doing)
    assert parse_refused(refused) == ("NOT_FOUND", "x")


@pytest.mark.parametrize(
    "data",
    [b"\x00\x00", (MAX_FRAME + 1).to_bytes(2, "big") + bytes(MAX_FRAME + 1)],
    ids=["empty", "too long"],
)
def test_a_frame_of_a_bad_length_is_an_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        take_frames(bytearray(data))


@pytest.mark.parametrize(
    "body", [b"H\x00\x05ab", b"H\x00", b"H\x00\x01\xff\x00\x00"], ids=["cut", "short", "utf-8"]
)
def test_a_malformed_hello_is_an_error(body: bytes) -> None:
    with pytest.raises(FrameError):
        parse_hello(body)


class Driver:
    """A `BeatServer` on loopback served by an event loop in its own thread."""

    def __init__(self) -> None:
        self.listener = RecordingListener()
        self._loop = Loop()
        self.run = self._loop.run
        self.server = BeatServer(self.listener, TOKEN, "127.0.0.1", tick=0.02)
        self.run(self.server.start())

    def close(self) -> None:
        self.run(self.server.stop())
        self._loop.close()


@pytest.fixture
def driver() -> Iterator[Driver]:
    running = Driver()
    yield running
    running.close()


class Sender:
    """A `BeatSender` on its own thread; `evicted` is set when it calls `on_evicted`."""

    def __init__(self, worker_id: str, interval: float = 0.05) -> None:
        self.progress = (0, 0)
        self.evicted = threading.Event()
        self.stop = threading.Event()
        self.sender = BeatSender(
            TOKEN, worker_id, interval, lambda: self.progress, self.evicted.set, self.stop
        )
        self.thread = threading.Thread(target=self.sender.run, daemon=True)
        self.thread.start()

    def close(self) -> float:
        """Stop it; the seconds `run` took to return."""
        started = time.monotonic()
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()
        return time.monotonic() - started


def test_a_sender_beats_where_it_is_aimed_and_stops_promptly(driver: Driver) -> None:
    sender = Sender("w1")
    try:
        time.sleep(0.2)
        assert driver.listener.of("heartbeat", "w1") == [], "no beat before a target is known"
        sender.sender.aim(BeatTarget("127.0.0.1", driver.server.port))
        driver.listener.wait_for("heartbeat", "w1", count=3)
        sender.progress = (4, 9, 5, True)  # round, commit, durable commit, stale
        wait = len(driver.listener.of("heartbeat", "w1")) + 2
        assert driver.listener.wait_for("heartbeat", "w1", count=wait)[-1][2:6] == (4, 9, 5, True)
    finally:
        assert sender.close() < 1.0


def test_a_sender_follows_the_driver_to_a_new_port(driver: Driver) -> None:
    """A restarted driver names a new port on the event stream: beats go there at once."""
    other = BeatServer(driver.listener, TOKEN, "127.0.0.1", tick=0.02)
    driver.run(other.start())
    sender = Sender("w1")
    try:
        sender.sender.aim(BeatTarget("127.0.0.1", driver.server.port))
        driver.listener.wait_for("heartbeat", "w1")
        driver.run(driver.server.stop())  # the old driver is gone
        before = len(driver.listener.of("heartbeat", "w1"))
        sender.sender.aim(BeatTarget("127.0.0.1", other.port))
        driver.listener.wait_for("heartbeat", "w1", count=before + 3)
        assert not sender.evicted.is_set()
    finally:
        sender.close()
        driver.run(other.stop())


def test_a_sender_refused_not_found_calls_on_evicted_and_ends(driver: Driver) -> None:
    sender = Sender("w1")
    sender.sender.aim(BeatTarget("127.0.0.1", driver.server.port))
    driver.listener.wait_for("heartbeat", "w1")
    driver.listener.unknown.add("w1")
    assert sender.evicted.wait(5)
    sender.thread.join(5)
    assert not sender.thread.is_alive()


def test_a_sender_beats_with_descriptors_past_1024(driver: Driver) -> None:
    """A training process may hold more than 1,024 files (data loaders, shared memory):
    `select()` cannot watch a socket numbered past that, `poll()` can."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}: no socket can be numbered past 1,024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.dup(0) for _ in range(1100)]  # the sender's socket gets a number past them
    sender = Sender("w1")
    try:
        sender.sender.aim(BeatTarget("127.0.0.1", driver.server.port))
        driver.listener.wait_for("heartbeat", "w1", count=3)
    finally:
        sender.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
