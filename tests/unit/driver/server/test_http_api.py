"""The driver's HTTP API in-process, and the worker's Store over a real loopback server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import anyio
import httpx
import pytest
from fastapi import FastAPI

from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.limits import MAX_BODY_BYTES
from elastic.driver.server.services import Services
from elastic.protocol.http import (
    MAX_KEY_LENGTH,
    MAX_KEYS_PER_REQUEST,
    MAX_ROUND,
    MAX_VALUE_BYTES,
    CompareSetRequest,
    HostStatus,
    JobStatus,
    SlotInfo,
)
from elastic.worker.driver_link.http_client import DriverClient, DriverError
from elastic.worker.driver_link.kv_store import DriverStore

TOKEN = "s3cret-token-value"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLOT = SlotInfo(
    hostname="h", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1
)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def make_services() -> Services:
    rendezvous = Rendezvous()
    status = JobStatus(
        job_id="j1", round=1, size=1, hosts=[HostStatus(hostname="h", slots=1)], workers=[]
    )
    return Services(TOKEN, MemoryKeyValueStore(), rendezvous, lambda: status)


async def with_client(check) -> None:
    services = make_services()
    services.rendezvous.form([("w1", "h")])
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://driver") as client:
        await check(client)


def run(check) -> None:
    asyncio.run(with_client(check))


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}],
)
def test_requests_without_the_token_are_refused(headers: dict[str, str]) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        for method, path, body in [
            ("GET", "/v1/status", None),
            ("POST", "/v1/kv/set", {"epoch": 1, "key": "k", "value": b64(b"v")}),
            ("POST", "/v1/rendezvous/join", {"worker_id": "w1"}),
        ]:
            answer = await client.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, path
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            assert answer.json()["detail"] == "missing or wrong job token"
            assert TOKEN not in answer.text

    run(check)


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/v1/kv/set", b"{not json", 422),
        ("/v1/kv/set", b'{"epoch": 1, "key": "k"}', 422),
        ("/v1/kv/set", b'{"epoch": 1, "key": "k", "value": "%%%"}', 400),
        ("/v1/kv/set", b'{"epoch": -1, "key": "k", "value": ""}', 422),
        ("/v1/kv/set", b'{"epoch": 1, "key": "", "value": ""}', 422),
        ("/v1/kv/set", b'{"epoch": 1, "key": "k", "value": "", "extra": 1}', 422),
        ("/v1/kv/get", b'{"epoch": 1, "key": "k", "timeout": 1e9}', 422),
        ("/v1/kv/wait", b'{"epoch": 1, "keys": "k"}', 422),
        ("/v1/kv/add", b'{"epoch": 1, "key": "k", "amount": "many"}', 422),
        ("/v1/rendezvous/join", b'{"worker_id": ""}', 422),
        ("/v1/rendezvous/join", b'{"worker_id": "w", "after_epoch": -1}', 422),
        ("/v1/rendezvous/join", b"[]", 422),
        ("/v1/rendezvous/join", b'{"worker_id": "w", "pid": 2147483648}', 422),
        ("/v1/nowhere", b"{}", 404),
        # Inputs that once crashed the 422 answer (it echoed them) or the key's formatting.
        ("/v1/kv/get", b'{"epoch": 1, "key": "k", "timeout": NaN}', 422),
        ("/v1/kv/get", b'{"epoch": "\\ud800", "key": "k"}', 422),
        ("/v1/kv/get", b'{"epoch": 1, "key": "k", "\\udc00": 1}', 422),
        ("/v1/kv/get", b'{"epoch": 9007199254740992, "key": "k"}', 422),
        ("/v1/kv/get", b'{"epoch": 1' + b"0" * 5000 + b', "key": "k"}', 400),
    ],
)
def test_malformed_requests_get_a_4xx_with_a_message(path: str, body: bytes, code: int) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        headers = {**AUTH, "Content-Type": "application/json"}
        answer = await client.post(path, content=body, headers=headers)
        assert answer.status_code == code
        assert answer.json()["detail"]
        # The driver still serves afterwards.
        assert (await client.get("/v1/status", headers=AUTH)).status_code == 200

    run(check)


def test_oversized_key_is_refused() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        body = {"epoch": 1, "key": "k" * 5000, "value": ""}
        assert (await client.post("/v1/kv/set", json=body, headers=AUTH)).status_code == 422

    run(check)


def test_the_largest_valid_requests_fit_the_body_limit() -> None:
    values = CompareSetRequest(
        epoch=MAX_ROUND,
        key="k" * MAX_KEY_LENGTH,
        expected=b64(bytes(MAX_VALUE_BYTES)),
        desired=b64(bytes(MAX_VALUE_BYTES)),
    )
    assert len(values.model_dump_json()) < MAX_BODY_BYTES
    # Each key character escaped as a UTF-16 surrogate pair: the longest JSON that check/wait take.
    keys = {"epoch": MAX_ROUND, "keys": ["\U0001f600" * MAX_KEY_LENGTH] * MAX_KEYS_PER_REQUEST}
    assert len(json.dumps(keys, ensure_ascii=True)) < MAX_BODY_BYTES


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_gets_413_before_it_is_read_whole(framing: str) -> None:
    chunk = b"x" * (1 << 20)
    chunks_sent = 0

    async def stream() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        for _ in range(4 * MAX_BODY_BYTES // len(chunk)):
            chunks_sent += 1
            yield chunk

    async def check(client: httpx.AsyncClient) -> None:
        if framing == "content-length":
            body: bytes | AsyncIterator[bytes] = b"x" * (MAX_BODY_BYTES + 1)
        else:
            body = stream()
        answer = await client.post("/v1/kv/set", content=body, headers=AUTH)
        assert answer.status_code == 413
        assert "exceeds" in answer.json()["detail"]
        assert chunks_sent <= MAX_BODY_BYTES // len(chunk) + 1
        assert (await client.get("/v1/status", headers=AUTH)).status_code == 200

    run(check)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_the_body_limit_is_inclusive(framing: str) -> None:
    async def check() -> None:
        app = create_app(make_services(), max_body_bytes=64)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
            for size, code in [(64, 422), (65, 413)]:

                async def stream(size: int = size) -> AsyncIterator[bytes]:
                    for _ in range(size):
                        yield b"x"

                body = b"x" * size if framing == "content-length" else stream()
                answer = await client.post("/v1/kv/set", content=body, headers=AUTH)
                assert answer.status_code == code, size

    asyncio.run(check())


def test_an_unauthenticated_request_is_refused_before_its_body_is_read() -> None:
    app = create_app(make_services())
    body_reads = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal body_reads
        body_reads += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/kv/set",
        "raw_path": b"/v1/kv/set",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-length", str(1 << 30).encode()), (b"authorization", b"Bearer no")],
        "client": ("192.0.2.1", 1234),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))
    assert body_reads == 0
    assert sent[0]["status"] == 401
    headers = dict(sent[0]["headers"])
    assert headers[b"www-authenticate"] == b"Bearer"
    assert headers[b"connection"] == b"close"
    assert app.state.refused_peers == {"192.0.2.1"}


def _raw_post(url: str, head: bytes, body: bytes) -> bytes:
    """Send one request over a fresh loopback connection; return the answer up to its close."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(head + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_gets_413_over_a_real_socket(framing: str) -> None:
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    with serving(create_app(make_services(), max_body_bytes=1024)) as url:
        if framing == "content-length":
            head = b"POST /v1/kv/set HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4096\r\n"
            body = b"x" * 4096
        else:
            head = b"POST /v1/kv/set HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            body = b"400\r\n" + b"x" * 1024 + b"\r\n" + b"1\r\nx\r\n0\r\n\r\n"
        answer = _raw_post(url, head + auth + b"\r\n", body)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert b"connection: close" in answer.lower()
        status = httpx.get(f"{url}/v1/status", headers=AUTH)
        assert status.status_code == 200


def test_add_on_a_non_integer_value_is_a_conflict_not_a_crash() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        await client.post(
            "/v1/kv/set", json={"epoch": 1, "key": "k", "value": b64(b"x")}, headers=AUTH
        )
        answer = await client.post(
            "/v1/kv/add", json={"epoch": 1, "key": "k", "amount": 1}, headers=AUTH
        )
        assert answer.status_code == 409

    run(check)


def test_get_waits_for_a_later_set_and_keys_are_namespaced_by_epoch() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        waiting = asyncio.create_task(
            client.post("/v1/kv/get", json={"epoch": 2, "key": "k", "timeout": 10}, headers=AUTH)
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.post(
            "/v1/kv/set", json={"epoch": 1, "key": "k", "value": b64(b"one")}, headers=AUTH
        )
        await asyncio.sleep(0.05)
        assert not waiting.done(), "a key of epoch 1 must not answer a get in epoch 2"
        await client.post(
            "/v1/kv/set", json={"epoch": 2, "key": "k", "value": b64(b"two")}, headers=AUTH
        )
        answer = await asyncio.wait_for(waiting, 5)
        assert base64.b64decode(answer.json()["value"]) == b"two"

    run(check)


def test_get_times_out_with_404() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        body = {"epoch": 1, "key": "never", "timeout": 0.1}
        answer = await client.post("/v1/kv/get", json=body, headers=AUTH)
        assert answer.status_code == 404
        assert "never" in answer.json()["detail"]

    run(check)


def test_join_returns_the_slot_and_epoch_or_pending() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        answer = await client.post("/v1/rendezvous/join", json={"worker_id": "w1"}, headers=AUTH)
        assert answer.json() == {
            "status": "formed",
            "epoch": 1,
            "slot": SLOT.model_dump(),
            "job_commit": 0,
        }
        answer = await client.post(
            "/v1/rendezvous/join",
            json={"worker_id": "w1", "after_epoch": 1, "timeout": 0.05},
            headers=AUTH,
        )
        assert answer.json()["status"] == "pending"
        answer = await client.post(
            "/v1/rendezvous/join", json={"worker_id": "stranger", "timeout": 0.05}, headers=AUTH
        )
        assert answer.json()["status"] == "pending"

    run(check)


def test_a_key_wait_of_the_round_taken_up_from_an_earlier_driver_says_when_keys_are_lost() -> None:
    """A restarted driver holds none of the keys its predecessor held: ranks that were forming
    the round's group wait for them in vain, and the driver must hear of it."""
    services = make_services()
    lost: list[int] = []
    services.keys_lost = lost.append
    services.rendezvous.restore(7, [("w1", "h"), ("w2", "h")])

    async def check() -> None:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
            await client.post("/v1/kv/set", json={"epoch": 7, "key": "here", "value": "eA=="},
                              headers=AUTH)  # fmt: skip
            asks = [
                ("/v1/kv/get", {"epoch": 7, "key": "here", "timeout": 0}),  # held: nothing
                ("/v1/kv/wait", {"epoch": 7, "keys": ["here"], "timeout": 0}),
                ("/v1/kv/get", {"epoch": 7, "key": "gone", "timeout": 0}),  # lost
                ("/v1/kv/wait", {"epoch": 7, "keys": ["here", "gone"], "timeout": 0}),
            ]
            for path, body in asks:
                await client.post(path, json=body, headers=AUTH)
            assert lost == [7, 7]
            services.rendezvous.form([("w1", "h")])  # round 8: this driver's own
            await client.post("/v1/kv/get", json={"epoch": 8, "key": "k", "timeout": 0},
                              headers=AUTH)  # fmt: skip
            assert lost == [7, 7]

    asyncio.run(check())


def test_the_job_s_end_answers_every_key_wait_at_once() -> None:
    """A worker's long poll must not hold up the driver's exit (its host may have vanished,
    and the poll would run its full timeout)."""
    services = make_services()
    services.rendezvous.form([("w1", "h")])

    async def check() -> None:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
            waits = [
                asyncio.create_task(client.post(path, json=body, headers=AUTH))
                for path, body in (
                    ("/v1/kv/get", {"epoch": 1, "key": "k", "timeout": 30}),
                    ("/v1/kv/wait", {"epoch": 1, "keys": ["k"], "timeout": 30}),
                )
            ]
            await asyncio.sleep(0.05)
            assert not any(wait.done() for wait in waits)
            services.rendezvous.close()
            for wait in waits:
                answer = await asyncio.wait_for(wait, 5)
                assert answer.status_code == 410
                assert "ends with the job" in answer.text

    asyncio.run(check())


def test_a_newer_epoch_supersedes_waits_and_excluded_workers_are_told_to_leave() -> None:
    services = make_services()
    services.rendezvous.form([("w1", "h"), ("w2", "h")])

    async def check() -> None:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
            waiting = asyncio.create_task(
                client.post(
                    "/v1/kv/get", json={"epoch": 1, "key": "k", "timeout": 30}, headers=AUTH
                )
            )
            rejoin = asyncio.create_task(
                client.post(
                    "/v1/rendezvous/join", json={"worker_id": "w1", "after_epoch": 1}, headers=AUTH
                )
            )
            await asyncio.sleep(0.05)
            assert not waiting.done() and not rejoin.done()
            services.rendezvous.exclude("w2")
            services.rendezvous.form([("w1", "h")])
            assert (await asyncio.wait_for(waiting, 5)).status_code == 410
            joined = (await asyncio.wait_for(rejoin, 5)).json()
            assert joined["status"] == "formed" and joined["epoch"] == 2
            assert joined["slot"]["size"] == 1
            answer = await client.post(
                "/v1/rendezvous/join", json={"worker_id": "w2", "after_epoch": 1}, headers=AUTH
            )
            assert answer.json()["status"] == "not_member"

    asyncio.run(check())


def test_requests_are_served_with_the_thread_pool_exhausted() -> None:
    """Per-request dependencies run on the event loop: with every thread of the pool taken
    (as thousands of concurrent joins once took it), a join, a KV call and the status are
    still answered, and a refused token too."""

    async def check(client: httpx.AsyncClient) -> None:
        limiter = anyio.to_thread.current_default_thread_limiter()
        borrowers = [object() for _ in range(int(limiter.total_tokens))]
        for borrower in borrowers:
            await limiter.acquire_on_behalf_of(borrower)
        try:
            async with asyncio.timeout(10):
                join = {"worker_id": "w1", "after_epoch": 0, "timeout": 1}
                answer = await client.post("/v1/rendezvous/join", json=join, headers=AUTH)
                assert answer.json()["status"] == "formed"
                kv = {"epoch": 1, "key": "k", "value": b64(b"v")}
                assert (await client.post("/v1/kv/set", json=kv, headers=AUTH)).status_code == 200
                assert (await client.get("/v1/status", headers=AUTH)).status_code == 200
                refused = await client.get("/v1/status", headers={"Authorization": "Bearer x"})
                assert refused.status_code == 401
        finally:
            for borrower in borrowers:
                limiter.release_on_behalf_of(borrower)

    run(check)


def test_status_never_contains_the_token() -> None:
    async def check(client: httpx.AsyncClient) -> None:
        answer = await client.get("/v1/status", headers=AUTH)
        assert answer.json()["job_id"] == "j1"
        assert TOKEN not in answer.text

    run(check)


def test_openapi_schema_documents_every_route() -> None:
    paths = create_app(make_services()).openapi()["paths"]
    for route in ["set", "get", "add", "compare_set", "check", "wait", "delete", "num_keys"]:
        assert f"/v1/kv/{route}" in paths
    assert "/v1/rendezvous/join" in paths and "/v1/status" in paths


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` served by a real driver HTTP server on loopback, in its own event loop thread;
    yields the server's URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> HttpServer:
        server = HttpServer(app, "127.0.0.1")
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield server.url
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def live_server() -> Iterator[str]:
    """A real driver HTTP server on loopback."""
    with serving(create_app(make_services())) as url:
        yield url


def test_driver_store_implements_the_c10d_store_semantics(live_server: str) -> None:
    client = DriverClient(live_server, TOKEN, retry_for=5)
    store = DriverStore(client, round_=3, timeout=timedelta(seconds=1))
    store.set("a", b"\x00\x01binary")
    assert store.get("a") == b"\x00\x01binary"
    assert store.add("n", 2) == 2 and store.add("n", 5) == 7
    assert store.get("n") == b"7"
    assert store.compare_set("c", b"", b"first") == b"first"
    assert store.compare_set("c", b"wrong", b"x") == b"first"
    assert store.compare_set("c", b"first", b"second") == b"second"
    assert store.compare_set("missing", b"expected", b"x") == b"expected"
    assert store.check(["a", "n"]) and not store.check(["a", "absent"])
    store.wait(["a", "c"])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")
    with pytest.raises(TimeoutError):
        store.get("absent")
    with pytest.raises(TimeoutError):
        store.wait(["absent"], timedelta(seconds=0.2))
    other_round = DriverStore(client, round_=4, timeout=timedelta(seconds=0.2))
    assert not other_round.check(["n"])
    client.close()


def test_worker_client_with_a_wrong_token_gets_a_clear_error(live_server: str) -> None:
    client = DriverClient(live_server, "wrong", retry_for=1)
    with pytest.raises(DriverError, match="401"):
        DriverStore(client, 1, timedelta(seconds=1)).set("k", b"v")


def test_unreachable_driver_fails_after_the_retry_budget() -> None:
    client = DriverClient("http://127.0.0.1:9", TOKEN, retry_for=0.5)
    with pytest.raises(DriverError, match="unreachable"):
        DriverStore(client, 1, timedelta(seconds=1)).set("k", b"v")
