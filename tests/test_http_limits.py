"""What a peer can make the driver's HTTP server hold (issue 8, item 7): a KV counter past
int64."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from elastic.driver.server.app import create_app
from elastic.driver.state.kv import INT64_MAX, INT64_MIN
from elastic.driver.state.memory import MemoryKeyValueStore
from tests.test_http_api import AUTH, make_services

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
