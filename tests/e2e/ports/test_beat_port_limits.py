"""What a peer without the job token can hold on the heartbeat port: the real `BeatServer` on an
event loop, hostile peers in processes of their own on loopback, a real `BeatSender` beside
them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from elastic.driver.control.heartbeat_port import BeatServer
from elastic.driver.control.port_limits import (
    READ_PER_LOOK,
    STRANGER_BYTES,
    STRANGER_GRACE,
    BeatPortLimits,
)
from elastic.driver.server.tls import TlsIdentity
from elastic.protocol.beats import beat_frame, hello_frame
from elastic.protocol.pinning import pinned_ssl_context
from elastic.worker.driver_link.heartbeats import BeatSender, BeatTarget
from tests.support.loop_thread import Loop
from tests.support.paths import REPOSITORY as ROOT
from tests.unit.driver.control.test_control import RecordingListener, wait_until

TOKEN = "beats-token"
BEATS_LOGGER = "elastic.driver.control.heartbeat_port"

# Floods `port` for `seconds` from four threads: with a hello (hex, else none) an endless
# stream of beats on one connection each, else endless max-size frames that are no hello,
# connecting again whenever the driver closes the connection. Prints "flooding", then how
# many connections it made and how many the driver cut.
FLOODER = r"""
import json, socket, sys, threading, time
port, seconds, hello = int(sys.argv[1]), float(sys.argv[2]), bytes.fromhex(sys.argv[3])
if hello:
    chunk = bytes.fromhex(sys.argv[4]) * 2400
else:
    chunk = ((4096).to_bytes(2, "big") + b"H" + b"\xff" * 4095) * 64
counts = {"connections": 0, "cut": 0}

def flood():
    while time.monotonic() - started < seconds:
        sock = socket.create_connection(("127.0.0.1", port))
        counts["connections"] += 1
        try:
            sock.sendall(hello)  # with a hello, whole frames: the driver reads at its pace
            while time.monotonic() - started < seconds:
                sock.sendall(chunk)
        except OSError:
            counts["cut"] += 1
        sock.close()

print("flooding", flush=True)
started = time.monotonic()
threads = [threading.Thread(target=flood) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(counts), flush=True)
"""

# Opens `count` connections to `port` from the address `source`, sends `payload` (hex) on each,
# prints "open", and watches them for `hold` seconds or until the driver closed all of them;
# then prints how many it closed and when the last one closed (seconds after "open").
SILENT = r"""
import json, resource, select, socket, sys, time
port, count, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
payload, hold = bytes.fromhex(sys.argv[4]), float(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 256)), hard))
poller, by_fd = select.poll(), {}
for _ in range(count):
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    if payload:
        sock.sendall(payload)
    by_fd[sock.fileno()] = sock
    poller.register(sock, select.POLLIN)
started = time.monotonic()
print("open", flush=True)
closed = []
while len(closed) < count and time.monotonic() - started < hold:
    for fd, _ in poller.poll(50):
        try:
            data = by_fd[fd].recv(65536)
        except OSError:
            data = b""
        if not data:  # the end of the stream (or a reset): the driver closed it
            closed.append(time.monotonic() - started)
            poller.unregister(fd)
print(json.dumps({"closed": len(closed), "last": max(closed, default=None)}), flush=True)
"""


def python(script: str, *args: object) -> subprocess.Popen[str]:
    """`script` in a Python process of its own, its stdout a pipe of lines."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts: killed (by PID) if still running when it ends."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


def first_line(process: subprocess.Popen[str], expected: str) -> None:
    assert process.stdout is not None
    assert process.stdout.readline().strip() == expected


def last_line(process: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    """The JSON line a helper process prints as it ends."""
    process.wait(timeout)
    assert process.stdout is not None
    return json.loads(process.stdout.readline())


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass
class LoopWatch:
    """What a coroutine ticking every 10 ms on the driver's loop saw: the loop's longest stall,
    the most bytes the server held unparsed, and the process's largest resident size."""

    longest_stall: float = 0.0
    most_buffered: int = 0
    most_resident: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, server: BeatServer) -> None:
        loop = asyncio.get_running_loop()
        ticks = 0
        while not self.stop.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            self.longest_stall = max(self.longest_stall, loop.time() - before - 0.01)
            self.most_buffered = max(self.most_buffered, server.buffered)
            ticks += 1
            if ticks % 5 == 0:
                self.most_resident = max(self.most_resident, resident_bytes())


class CountingListener(RecordingListener):
    """Records every call but the beats of "flood", which it counts: tens of thousands of
    records would cost the test process seconds of garbage collection, not the driver."""

    def __init__(self) -> None:
        super().__init__()
        self.flood_beats = 0

    def heartbeat(self, worker_id: str, *args: Any, **kwargs: Any) -> bool:
        if worker_id == "flood":
            self.flood_beats += 1
            return True
        return super().heartbeat(worker_id, *args, **kwargs)


class Driver:
    """A `BeatServer` on loopback served by an event loop in its own thread."""

    def __init__(self, hello_within: float = 10.0, limits: BeatPortLimits | None = None) -> None:
        self.listener = CountingListener()
        self._loop = Loop()
        self.run = self._loop.run
        self.server = BeatServer(
            self.listener, TOKEN, "127.0.0.1", hello_within=hello_within, limits=limits
        )
        self.run(self.server.start())

    def watch(self) -> tuple[LoopWatch, Any]:
        """Start a `LoopWatch`; returns it and the future of its run."""

        async def make() -> LoopWatch:
            return LoopWatch()

        watch = self.run(make())
        running = asyncio.run_coroutine_threadsafe(watch.run(self.server), self._loop.loop)
        return watch, running

    def end_watch(self, watch: LoopWatch, running: Any) -> None:
        self._loop.loop.call_soon_threadsafe(watch.stop.set)
        running.result(10)

    def count(self, name: str) -> int:
        async def read() -> int:
            return int(getattr(self.server, name))

        return int(self.run(read()))

    def close(self) -> None:
        self.run(self.server.stop())
        self._loop.close()


def test_beats_past_a_looks_budget_are_read_at_the_next_looks_with_tls() -> None:
    """A burst of beats larger than one look's budget, then silence: over TLS the rest may
    wait decrypted in the TLS layer, where epoll does not see it; the next looks read it."""
    identity = TlsIdentity.make_self_signed(["127.0.0.1"])
    listener = CountingListener()
    loop = Loop()
    server = BeatServer(listener, TOKEN, "127.0.0.1", ssl_context=identity.server_ssl_context())
    loop.run(server.start())
    try:
        burst = 5 * READ_PER_LOOK // len(beat_frame(1, 0)) + 1
        raw = socket.create_connection(("127.0.0.1", server.port))
        with pinned_ssl_context(identity.cert_pem).wrap_socket(
            raw, server_hostname="127.0.0.1"
        ) as sock:
            sock.sendall(hello_frame(TOKEN, "flood") + beat_frame(1, 0) * burst)
            wait_until(lambda: listener.flood_beats == burst)
    finally:
        loop.run(server.stop())
        loop.close()


class Worker:
    """A real `BeatSender` on its own thread, beating every 50 ms."""

    def __init__(self, driver: Driver, worker_id: str) -> None:
        self.stop = threading.Event()
        self.sender = BeatSender(TOKEN, worker_id, 0.05, lambda: (1, 0), lambda: None, self.stop)
        self.sender.aim(BeatTarget("127.0.0.1", driver.server.port))
        self.thread = threading.Thread(target=self.sender.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def longest_gap(driver: Driver, worker_id: str, start: float, end: float) -> float:
    """The longest time between two of `worker_id`'s beats reported in [start, end]."""
    times = [call[-1] for call in driver.listener.of("heartbeat", worker_id)]
    inside = [t for t in times if start <= t <= end]
    points = [start, *inside, end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


@pytest.mark.parametrize("authenticated", [False, True], ids=["stranger", "with the token"])
def test_a_flood_at_full_speed_neither_stalls_the_loop_nor_fills_memory(
    processes: list[subprocess.Popen[str]], authenticated: bool
) -> None:
    """A peer sending as fast as it can for 2 s: the driver reads a bounded amount per look,
    so its loop keeps ticking, a real worker's beats keep being reported, and what it holds
    unparsed stays under two frames a connection. A stranger is cut off after one frame that
    is no hello (and connects again, and again)."""
    driver = Driver()
    worker = Worker(driver, "w1")
    try:
        driver.listener.wait_for("heartbeat", "w1", count=3)
        hello = hello_frame(TOKEN, "flood") if authenticated else b""
        watch, running = driver.watch()
        resident_before = resident_bytes()
        flooder = python(FLOODER, driver.server.port, 2.0, hello.hex(), beat_frame(1, 0).hex())
        processes.append(flooder)
        first_line(flooder, "flooding")
        started = time.monotonic()
        flooded = last_line(flooder)
        ended = time.monotonic()
        driver.end_watch(watch, running)
        print(f"flood: {flooded}, {driver.listener.flood_beats} beats, loop stalled "
              f"{watch.longest_stall:.3f} s at most, {watch.most_buffered} bytes buffered at most, "
              f"resident +{(watch.most_resident - resident_before) / 2**20:.1f} MiB")  # fmt: skip
        assert watch.longest_stall < 0.5
        assert longest_gap(driver, "w1", started, ended) < 1.0, "the worker's beats kept coming"
        assert watch.most_resident - resident_before < 100 * 2**20
        assert watch.most_buffered < 6 * STRANGER_BYTES  # the worker's and the flooder's four
        if authenticated:
            assert flooded["cut"] == 0 and driver.listener.flood_beats > 0
        else:
            assert flooded["cut"] >= 1 and flooded["cut"] >= flooded["connections"] - 4
    finally:
        worker.close()
        driver.close()


def test_two_thousand_silent_connections_hold_few_descriptors_and_lock_out_no_worker(
    processes: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """2,000 connections from one address that say nothing: the driver holds at most its
    share of descriptors (a new connection closes the oldest silent one), after the strangers'
    grace only that address's share of them, and at the hello deadline none; a real worker from the
    same address connects and beats meanwhile; the log gets a line per kind of closing, not
    one per connection."""
    caplog.set_level(logging.WARNING, logger=BEATS_LOGGER)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2_400:
        pytest.skip(f"the hard open-file limit is {hard}: 2,000 connections do not fit")
    limits = BeatPortLimits(max_connections=600)  # a share of 600 descriptors: ~6,000 files
    driver = Driver(hello_within=STRANGER_GRACE + 2.0, limits=limits)
    worker: Worker | None = None
    try:
        before = open_files()
        silent = python(SILENT, driver.server.port, 2_000, "127.0.0.1", "", 20.0)
        processes.append(silent)
        first_line(silent, "open")
        most = open_files()
        worker = Worker(driver, "w1")
        driver.listener.wait_for("heartbeat", "w1", count=3)
        wait_until(lambda: driver.count("strangers") <= limits.max_strangers_per_peer)
        while silent.poll() is None:
            most = max(most, open_files())
            time.sleep(0.01)  # sampling, not waiting for anything
        closed = last_line(silent)
        print(f"held {most - before} more descriptors at most; the peer saw {closed}")
        assert most - before <= limits.max_connections + 8
        assert closed["closed"] == 2_000, "every silent connection was closed"
        assert closed["last"] < STRANGER_GRACE + 2.0 + 5.0, "by the hello deadline at the latest"
        lines = [r.getMessage() for r in caplog.records if r.name == BEATS_LOGGER]
        print("\n".join(lines))
        assert 1 <= len(lines) <= 3
    finally:
        if worker is not None:
            worker.close()
        driver.close()


def test_one_address_cannot_crowd_out_another_s_strangers(
    processes: list[subprocess.Popen[str]],
) -> None:
    """A peer holding more connections without a hello than an address may, past the
    strangers' grace, has its own oldest ones closed; another address's stay until their
    hello deadline."""
    limits = BeatPortLimits(max_strangers=200, max_strangers_per_peer=50)
    driver = Driver(hello_within=30.0, limits=limits)
    try:
        hold = STRANGER_GRACE + 3.0
        other = python(SILENT, driver.server.port, 10, "127.0.0.3", "", hold)
        processes.append(other)
        first_line(other, "open")
        crowd = python(SILENT, driver.server.port, 300, "127.0.0.2", "", hold)
        processes.append(crowd)
        first_line(crowd, "open")
        wait_until(lambda: driver.count("held") == 10 + 50)
        assert last_line(crowd)["closed"] == 300 - 50
        assert last_line(other)["closed"] == 0
    finally:
        driver.close()


# A driver with an open-file limit of 64 and port limits above it, logging to stderr, while
# 200 connections arrive: accept fails for want of descriptors at every look.
FEW_DESCRIPTORS = r"""
import asyncio, logging, resource, socket, sys, time
from elastic.driver.control.heartbeat_port import BeatServer
from elastic.driver.control.port_limits import BeatPortLimits
from tests.unit.driver.control.test_control import RecordingListener
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

async def main():
    limits = BeatPortLimits(max_connections=10_000, max_strangers=10_000,
                            max_strangers_per_peer=10_000)
    server = BeatServer(RecordingListener(), "t", "127.0.0.1", hello_within=60, limits=limits)
    await server.start()
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # peers are in
    started = time.process_time()
    await asyncio.sleep(2.0)
    print(f"{time.process_time() - started:.3f}", flush=True)
    await server.stop()

asyncio.run(main())
"""


def test_running_out_of_descriptors_logs_one_line_and_does_not_spin() -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", FEW_DESCRIPTORS],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    peers = []
    try:
        assert driver.stdout is not None and driver.stdin is not None
        port = int(driver.stdout.readline())
        peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        driver.stdin.write("\n")
        driver.stdin.flush()
        cpu = float(driver.stdout.readline())
        _, errors = driver.communicate(timeout=30)
    finally:
        for peer in peers:
            peer.close()
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
    print(errors)
    assert errors.count("cannot accept") == 1
    assert "Traceback" not in errors
    assert cpu < 1.0, f"{cpu} s of CPU in 2 s: it does not spin"
