"""What a peer can make the driver's HTTP server hold (issue 8, item 7): a KV counter past
int64, connections that idle or never finish their request head, more connections than the
limit. Real sockets on 127.0.0.1 against the real server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.rendezvous.store import INT64_MAX, INT64_MIN
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.connections import ConnectionLimits
from tests.unit.driver.server.test_http_api import AUTH, make_services

IDLE = 1.0  # the idle timeout these tests serve with


@contextlib.contextmanager
def serving(limits: ConnectionLimits) -> Iterator[HttpServer]:
    """The driver's HTTP server with `limits` on loopback, in its own event loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    services = make_services()
    services.rendezvous.form([("w1", "h")])

    async def start() -> HttpServer:
        server = HttpServer(create_app(services), "127.0.0.1", limits=limits)
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def closed_within(conn: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closed `conn` (EOF or reset), or None if it was still open
    after `timeout`. Whatever the server sends before closing is read and dropped."""
    start = time.monotonic()
    conn.settimeout(0.05)
    while (elapsed := time.monotonic() - start) < timeout:
        try:
            if conn.recv(65536) == b"":
                return elapsed
        except TimeoutError:
            continue
        except ConnectionResetError:
            return elapsed
    return None


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def status_ok(host: str, port: int) -> bool:
    """An authenticated request on a fresh connection gets its answer."""
    answer = httpx.get(f"http://{host}:{port}/v1/status", headers=AUTH, timeout=5)
    return answer.status_code == 200


# --- KV counters stay int64 --------------------------------------------------------------


async def kv_client_check(check) -> None:
    services = make_services()
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://driver") as client:
        await check(client)


@pytest.mark.parametrize(
    ("start", "amount"),
    [(INT64_MAX, 1), (INT64_MIN, -1), (INT64_MAX - 5, 1 << 62), (1 << 62, 1 << 62)],
)
def test_an_add_past_int64_is_refused_and_the_counter_stays(start: int, amount: int) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        key = {"epoch": 1, "key": "n"}
        if start == 1 << 62:  # reached by adds alone, as a worker would
            answer = await client.post("/v1/kv/add", json={**key, "amount": start}, headers=AUTH)
            assert answer.json() == {"value": start}
        else:
            await client.post("/v1/kv/set", json={**key, "value": b64(start)}, headers=AUTH)
        answer = await client.post("/v1/kv/add", json={**key, "amount": amount}, headers=AUTH)
        assert answer.status_code == 409, answer.text
        assert "would leave the int64 range" in answer.json()["detail"]
        got = await client.post("/v1/kv/get", json=key, headers=AUTH)
        assert base64.b64decode(got.json()["value"]) == str(start).encode()

    asyncio.run(kv_client_check(check))


def b64(number: int) -> str:
    return base64.b64encode(str(number).encode()).decode()


def test_a_stored_value_beyond_int64_cannot_be_added_to() -> None:
    store = MemoryKeyValueStore()

    async def check() -> None:
        await store.set("k", str(INT64_MAX + 1).encode())
        with pytest.raises(ValueError, match="int64"):
            await store.add("k", 0)
        assert await store.get("k", 0) == str(INT64_MAX + 1).encode()
        assert await store.add("m", INT64_MAX) == INT64_MAX
        assert await store.add("m", INT64_MIN) == -1

    asyncio.run(check())


def test_an_amount_beyond_the_schema_is_a_422() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        body = {"epoch": 1, "key": "n", "amount": 1 << 63}
        answer = await client.post("/v1/kv/add", json=body, headers=AUTH)
        assert answer.status_code == 422

    asyncio.run(kv_client_check(check))


# --- connections that never finish a request ---------------------------------------------


def test_half_request_lines_are_closed_while_workers_are_served() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        host, port = server.host, server.port
        held = []
        for _ in range(20):
            conn = socket.create_connection((host, port), timeout=5)
            conn.sendall(b"POST /v1/kv/se")  # half a request line, then nothing
            held.append(conn)
        time.sleep(IDLE / 2)
        assert status_ok(host, port)
        closed = [closed_within(conn, IDLE * 4) for conn in held]
        for conn in held:
            conn.close()
        assert None not in closed, f"still open after {IDLE * 4} s: {closed}"
        assert max(closed) < IDLE * 3  # from their start, IDLE / 2 of it slept above
        assert status_ok(host, port)


def test_a_head_trickled_byte_by_byte_is_still_closed_at_the_deadline() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        host, port = server.host, server.port
        conn = socket.create_connection((host, port), timeout=5)
        start = time.monotonic()
        closed_at = None
        for byte in b"GET /v1/status HTTP/1.1\r\nHost: d\r\nX-Slow: " + b"x" * 100:
            try:
                conn.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic() - start
                break
            if closed_within(conn, IDLE / 5) is not None:
                closed_at = time.monotonic() - start
                break
        conn.close()
        assert closed_at is not None, "a trickled head was never cut off"
        assert IDLE * 0.8 < closed_at < IDLE * 3


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        host, port = server.host, server.port
        with httpx.Client(base_url=f"http://{host}:{port}", headers=AUTH) as client:
            assert client.get("/v1/status").status_code == 200
        conn = socket.create_connection((host, port), timeout=5)
        conn.sendall(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth_line() + b"\r\n")
        answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        closed = closed_within(conn, IDLE * 4)
        conn.close()
        assert closed is not None and closed < IDLE * 3


def test_a_long_poll_outlives_the_idle_timeout() -> None:
    with serving(ConnectionLimits(max_connections=64, idle_timeout=IDLE)) as server:
        host, port = server.host, server.port
        body = {"epoch": 1, "key": "absent", "timeout": IDLE * 2.5}
        start = time.monotonic()
        answer = httpx.post(f"http://{host}:{port}/v1/kv/get", json=body, headers=AUTH, timeout=10)
        assert answer.status_code == 404
        assert time.monotonic() - start >= IDLE * 2.5


def auth_line() -> bytes:
    return f"Authorization: {AUTH['Authorization']}\r\n".encode()


# --- the connection limit ----------------------------------------------------------------


def test_past_the_limit_the_longest_idle_connection_makes_room() -> None:
    limits = ConnectionLimits(max_connections=8, idle_timeout=30)  # only the limit acts here
    with serving(limits) as server:
        host, port = server.host, server.port
        idle = []
        for _ in range(8):
            conn = socket.create_connection((host, port), timeout=5)
            conn.sendall(b"GET /v1/sta")
            idle.append(conn)
            wait_until(lambda: server.connections == (len(idle), len(idle)))  # in this order
        assert status_ok(host, port)  # the 9th connection: the oldest idle one gave way
        assert closed_within(idle[0], 5) is not None
        assert all(closed_within(conn, 0.2) is None for conn in idle[2:])
        for _ in range(4):
            assert status_ok(host, port)
        for conn in idle:
            conn.close()


def test_past_the_limit_with_every_connection_busy_a_new_one_is_refused() -> None:
    limits = ConnectionLimits(max_connections=4, idle_timeout=30)
    with serving(limits) as server:
        host, port = server.host, server.port
        url = f"http://{host}:{port}"
        results: list[int] = []

        def long_poll() -> None:
            body = {"epoch": 1, "key": "absent", "timeout": 2.0}
            results.append(httpx.post(f"{url}/v1/kv/get", json=body, headers=AUTH).status_code)

        polls = [threading.Thread(target=long_poll) for _ in range(4)]
        for poll in polls:
            poll.start()
        wait_until(lambda: server.connections == (4, 0))  # four requests in progress
        extra = socket.create_connection((host, port), timeout=5)
        assert closed_within(extra, 5) is not None, "a 5th connection was held"
        extra.close()
        for poll in polls:
            poll.join(10)
        assert results == [404] * 4  # the busy ones were served to their end
        wait_until(lambda: server.connections[0] == 0)
        assert status_ok(host, port)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ConnectionLimits(max_connections=0)
    with pytest.raises(ValueError):
        ConnectionLimits(idle_timeout=float("nan"))
    assert 1 <= ConnectionLimits().max_connections <= 8192
