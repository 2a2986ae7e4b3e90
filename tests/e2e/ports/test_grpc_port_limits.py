"""What a peer without the job token can hold on the gRPC control port: the real `ControlServer`
on an event loop, silent peers in processes of their own on loopback, a real `ControlClient`
beside them."""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Iterator

import pytest

from elastic.driver.control.events import HostsUpdated
from elastic.driver.control.port_limits import GrpcPortLimits
from elastic.driver.control.server import ControlServer
from elastic.driver.descriptors import descriptor_budget
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.membership_events import HostsUpdate
from tests.e2e.ports.test_beat_port_limits import SILENT, first_line, last_line, open_files, python
from tests.unit.driver.control import test_control
from tests.unit.driver.control.test_control import INTERVAL, TOKEN, start_client, wait_until

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # an HTTP/2 client's first bytes
SETTINGS = bytes.fromhex("000000040000000000")  # an empty SETTINGS frame


class Driver(test_control.Driver):
    """test_control's driver, its control port under `limits`."""

    def __init__(self, limits: GrpcPortLimits) -> None:
        self.limits = limits
        super().__init__()

    def start(self, port: int = 0) -> ControlServer:
        server = ControlServer(
            self.listener, TOKEN, "127.0.0.1", port, heartbeat_interval=INTERVAL,
            grpc_limits=self.limits,
        )  # fmt: skip
        self.run(server.start())
        self.server = server
        return server


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


@pytest.fixture
def clients() -> Iterator[list[ControlClient]]:
    started: list[ControlClient] = []
    yield started
    for client in started:
        client.close()


def test_the_default_bounds_close_a_silent_connection_within_20_s() -> None:
    limits = GrpcPortLimits()
    assert limits.handshake_timeout <= 20 and limits.idle_timeout <= 20
    assert limits.max_connections == descriptor_budget().grpc


def test_connections_that_make_no_call_are_closed_within_the_bounds(
    processes: list[subprocess.Popen[str]],
) -> None:
    """Nothing, the HTTP/2 preface alone, the preface and SETTINGS but no call: each kind of
    connection is closed by the handshake deadline or, once it sent SETTINGS, the idle one."""
    driver = Driver(GrpcPortLimits(handshake_timeout=1.0, idle_timeout=2.0))
    try:
        peers = {
            "nothing": python(SILENT, driver.server.port, 20, "127.0.0.1", "", 20.0),
            "preface": python(SILENT, driver.server.port, 20, "127.0.0.1", PREFACE.hex(), 20.0),
            "settings": python(
                SILENT, driver.server.port, 20, "127.0.0.1", (PREFACE + SETTINGS).hex(), 20.0
            ),
        }
        processes.extend(peers.values())
        for peer in peers.values():
            first_line(peer, "open")
        seen = {name: last_line(peer) for name, peer in peers.items()}
        print(seen)
        assert all(closed["closed"] == 20 for closed in seen.values())
        assert seen["nothing"]["last"] < 1.0 + 4.0
        assert seen["preface"]["last"] < 1.0 + 4.0
        assert seen["settings"]["last"] < 2.0 + 4.0
    finally:
        driver.close()


def test_silent_connections_are_capped_and_a_workers_stream_keeps_working(
    processes: list[subprocess.Popen[str]], clients: list[ControlClient]
) -> None:
    """2,000 connections that send the preface and nothing more: gRPC holds at most its cap
    of them (the rest are closed at once), and a worker's event stream and heartbeats, open
    before them, go on."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2_400:
        pytest.skip(f"the hard open-file limit is {hard}: 2,000 connections do not fit")
    cap = 100
    driver = Driver(GrpcPortLimits(max_connections=cap))
    try:
        _, events = start_client(driver, clients, "w1")
        driver.listener.wait_for("stream_opened", "w1")
        before = open_files()
        silent = python(SILENT, driver.server.port, 2_000, "127.0.0.1", PREFACE.hex(), 6.0)
        processes.append(silent)
        first_line(silent, "open")
        beats = len(driver.listener.of("heartbeat", "w1"))
        driver.send("w1", HostsUpdated(version=3, next_round=4, added=("h2",)))
        assert wait_until(lambda: events.pending_update(3)) == HostsUpdate(4, True, False)
        driver.listener.wait_for("heartbeat", "w1", count=beats + 3)
        most = open_files()
        while silent.poll() is None:
            most = max(most, open_files())
            time.sleep(0.01)  # sampling, not waiting for anything
        closed = last_line(silent)
        print(f"held {most - before} more descriptors at most; the peer saw {closed}")
        assert most - before <= cap + 16
        assert closed["closed"] >= 2_000 - cap
    finally:
        driver.close()


def test_no_limit_cuts_a_workers_event_stream(clients: list[ControlClient]) -> None:
    """The idle and handshake limits far below a stream's life: a worker's event stream is a
    call in progress, so its connection is never idle; it stays open and carries events."""
    driver = Driver(GrpcPortLimits(handshake_timeout=0.3, idle_timeout=0.3))
    try:
        _, events = start_client(driver, clients, "w1")
        driver.listener.wait_for("stream_opened", "w1")
        driver.listener.wait_for("heartbeat", "w1", count=30)  # 3 s, ten idle limits
        driver.send("w1", HostsUpdated(version=3, next_round=4, added=("h2",)))
        assert wait_until(lambda: events.pending_update(3)) == HostsUpdate(4, True, False)
        assert len(driver.listener.of("stream_opened", "w1")) == 1
        assert driver.listener.of("stream_closed", "w1") == []
    finally:
        driver.close()
