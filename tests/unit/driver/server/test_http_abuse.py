"""What a neighbour without the token can make the driver's HTTP server hold (issue 26, item 2):
login requests whose body never comes, a flood of them kept topped up, many connections from
one address, big bodies to open routes. Real sockets on loopback against the real server."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import httpx
import pytest

from elastic.driver.server.auth import LOGIN_BODY_BYTES
from elastic.driver.server.connections import MAX_PER_PEER, ConnectionLimits
from tests.unit.driver.server.test_http_api import AUTH, TOKEN
from tests.unit.driver.server.test_http_limits import closed_within, serving, wait_until

IDLE = 1.0  # the idle timeout these tests serve with


def login_head(port: int, length: int = 100) -> bytes:
    """A `POST /ui/login` head that announces a body; the body is never sent."""
    return (
        f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def held_login(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source` that sent a bodiless login request and waits."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    conn.sendall(login_head(port))
    return conn


def token_status(port: int) -> int:
    """The status of `GET /v1/status` with the token, on a fresh connection (0: no answer)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/status", headers=AUTH, timeout=5).status_code
    except httpx.TransportError:
        return 0


class Flood:
    """A thread that keeps about `target` bodiless login requests open against `port`,
    opening a new one for each the server closes, `BURST` at a time; `opened` counts them."""

    BURST = 16  # new connections at once: fewer than the server's limit (see docs/security.md)

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                held = [conn for conn in held if _still_open(conn)]
                for _ in range(min(self.BURST, self.target - len(held))):
                    with contextlib.suppress(OSError):
                        held.append(held_login(self.port))
                        self.opened += 1
                self._stop.wait(0.005)
        finally:
            for conn in held:
                conn.close()


def _still_open(conn: socket.socket) -> bool:
    """False (and `conn` closed here) once the server has closed it."""
    conn.setblocking(False)
    try:
        if conn.recv(65536, socket.MSG_DONTWAIT) != b"":
            return True
    except BlockingIOError:
        return True
    except OSError:
        pass
    conn.close()
    return False


def test_login_requests_whose_body_never_comes_are_closed_at_the_idle_timeout() -> None:
    with serving(ConnectionLimits(max_connections=512, idle_timeout=IDLE)) as server:
        held = [held_login(server.port) for _ in range(50)]
        wait_until(lambda: server.connections[0] == 50)
        closed = [closed_within(conn, IDLE * 4) for conn in held]
        for conn in held:
            conn.close()
        assert None not in closed, f"still open after {IDLE * 4} s: {closed}"
        assert token_status(server.port) == 200
        login = {"token": TOKEN}  # a login sent whole is answered: the entering page, a session
        answer = httpx.post(f"http://127.0.0.1:{server.port}/ui/login", data=login, timeout=5)
        assert answer.status_code == 200 and answer.cookies


def test_a_login_body_trickled_byte_by_byte_is_cut_at_the_deadline() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        start = time.monotonic()
        conn.sendall(login_head(server.port, length=200))
        closed_at = None
        for _ in range(200):  # one byte every IDLE / 5 s: 40 s if never cut
            try:
                conn.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic() - start
                break
            if closed_within(conn, IDLE / 5) is not None:
                closed_at = time.monotonic() - start
                break
        conn.close()
        assert closed_at is not None and closed_at < IDLE * 3, closed_at


def test_token_requests_are_answered_while_hundreds_of_held_logins_are_topped_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection cap is reached by strangers only: each token request finds room."""
    caplog.set_level(logging.WARNING)
    limits = ConnectionLimits(max_connections=64, idle_timeout=30, max_per_peer=4096)
    with serving(limits) as server, Flood(server.port, target=200) as flood:
        wait_until(lambda: flood.opened >= 200)
        answers = [token_status(server.port) for _ in range(40)]
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=AUTH) as worker:
            kept = [worker.get("/v1/status").status_code for _ in range(20)]
        opened = flood.opened
    assert answers == [200] * 40
    assert kept == [200] * 20
    assert opened > 200  # the server made room by closing held logins
    said = [r for r in caplog.records if r.name.startswith("elastic.driver.server")]
    assert 1 <= len(said) <= 3, [r.getMessage() for r in said]  # not one line per closing


def test_one_address_holds_at_most_max_per_peer_connections_without_the_token() -> None:
    limits = ConnectionLimits(max_connections=512, idle_timeout=30, max_per_peer=8)
    with serving(limits) as server:
        port = server.port
        workers = []  # connections that carried the token: not counted against the cap
        for _ in range(12):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth_line() + b"\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
            workers.append(conn)
        strangers = []
        for _ in range(8):
            strangers.append(held_login(port))
            wait_until(lambda: server.connections == (12 + len(strangers), 12 + len(strangers)))
        elsewhere = [held_login(port, source="127.0.0.2") for _ in range(8)]
        wait_until(lambda: server.connections[0] == 28)
        strangers.append(held_login(port))  # the 9th from 127.0.0.1: its oldest gives way
        assert closed_within(strangers[0], 5) is not None
        still = strangers[1:] + workers + elsewhere
        assert all(closed_within(conn, 0.1) is None for conn in still)
        assert token_status(port) == 200
        for conn in [*strangers, *workers, *elsewhere]:
            conn.close()


def test_the_default_per_peer_cap_lets_a_big_host_connect() -> None:
    assert MAX_PER_PEER >= 64 * 4
    assert ConnectionLimits().max_per_peer == MAX_PER_PEER
    with pytest.raises(ValueError):
        ConnectionLimits(max_per_peer=0)


def test_a_big_body_to_an_open_route_is_refused_before_it_is_read() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        for path in ("/metrics", "/ui/login"):
            conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            length = LOGIN_BODY_BYTES + 1
            head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n"
            conn.sendall(head.encode() + b"\r\n")
            answer = conn.recv(65536)
            conn.close()
            assert answer.startswith(b"HTTP/1.1 413 "), (path, answer[:100])


def auth_line() -> bytes:
    return f"Authorization: {AUTH['Authorization']}\r\n".encode()
