"""`/v1/kv`: the torch.distributed Store operations, namespaced by round (each body's `epoch`
field: the worker protocol keeps the round's first name)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import APIRouter, HTTPException

from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.server.auth import ServicesDep
from elastic.driver.server.services import Services
from elastic.protocol.http import (
    MAX_WAIT_SECONDS,
    AddRequest,
    AddResponse,
    CheckResponse,
    CompareSetRequest,
    CountResponse,
    DeleteResponse,
    GetRequest,
    KeyRequest,
    KeysRequest,
    RoundRequest,
    SetRequest,
    ValueResponse,
    WaitRequest,
)

router = APIRouter(prefix="/v1/kv", tags=["kv"])
T = TypeVar("T")


def _key(number: int, key: str) -> str:
    """`key` of round `number`, in the rendezvous store."""
    return Rendezvous.round_prefix(number) + key


def _decode(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(400, f"{field} is not valid base64") from None


def _encode(value: bytes) -> str:
    return base64.b64encode(value).decode()


async def _unless_superseded(svc: Services, number: int, wait: Awaitable[T]) -> T:
    """Await `wait`, but answer 410 as soon as a round newer than `number` forms: the waiting
    worker's group can never complete, and it must re-join (where, once the job ends, it is
    told to leave). The same as soon as the job ends: no wait holds the driver's exit up."""
    waiting = asyncio.ensure_future(wait)
    superseded = asyncio.ensure_future(svc.rendezvous.wait_superseded(number, MAX_WAIT_SECONDS))
    try:
        await asyncio.wait({waiting, superseded}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        superseded.cancel()
        if not waiting.done():
            waiting.cancel()
    if not waiting.done() or waiting.cancelled():
        if svc.rendezvous.closed:
            raise HTTPException(410, f"round {number} ends with the job")
        raise HTTPException(410, f"round {number} was superseded by round {svc.rendezvous.round}")
    return waiting.result()


@router.post("/set")
async def set_key(body: SetRequest, svc: ServicesDep) -> CheckResponse:
    await svc.kv.set(_key(body.epoch, body.key), _decode(body.value, "value"))
    return CheckResponse(ready=True)


async def _note_lost_keys(svc: Services, number: int, keys: list[str]) -> None:
    """Tell the driver when a wait is for keys of the round it took up from an earlier
    driver and one of them is missing: they may have been set on that driver."""
    if number == svc.rendezvous.restored and not await svc.kv.check(keys):
        svc.keys_lost(number)


@router.post(
    "/get",
    responses={
        404: {"description": "the key was not set within the timeout"},
        410: {"description": "a newer round formed: re-join"},
    },
)
async def get_key(body: GetRequest, svc: ServicesDep) -> ValueResponse:
    await _note_lost_keys(svc, body.epoch, [_key(body.epoch, body.key)])
    get = svc.kv.get(_key(body.epoch, body.key), body.timeout)
    value = await _unless_superseded(svc, body.epoch, get)
    if value is None:
        raise HTTPException(404, f"key {body.key!r} was not set within {body.timeout:g} s")
    return ValueResponse(value=_encode(value))


@router.post(
    "/add",
    responses={
        409: {
            "description": "the key holds no integer, or the sum would leave the int64 range "
            "of torch's Store counters; the key keeps its value"
        }
    },
)
async def add(body: AddRequest, svc: ServicesDep) -> AddResponse:
    try:
        return AddResponse(value=await svc.kv.add(_key(body.epoch, body.key), body.amount))
    except ValueError as err:
        raise HTTPException(409, str(err)) from None


@router.post("/compare_set")
async def compare_set(body: CompareSetRequest, svc: ServicesDep) -> ValueResponse:
    value = await svc.kv.compare_set(
        _key(body.epoch, body.key),
        _decode(body.expected, "expected"),
        _decode(body.desired, "desired"),
    )
    return ValueResponse(value=_encode(value))


@router.post("/check")
async def check(body: KeysRequest, svc: ServicesDep) -> CheckResponse:
    return CheckResponse(ready=await svc.kv.check([_key(body.epoch, k) for k in body.keys]))


@router.post("/wait")
async def wait(body: WaitRequest, svc: ServicesDep) -> CheckResponse:
    keys = [_key(body.epoch, k) for k in body.keys]
    await _note_lost_keys(svc, body.epoch, keys)
    ready = await _unless_superseded(svc, body.epoch, svc.kv.wait(keys, body.timeout))
    return CheckResponse(ready=ready)


@router.post("/delete")
async def delete(body: KeyRequest, svc: ServicesDep) -> DeleteResponse:
    return DeleteResponse(deleted=await svc.kv.delete(_key(body.epoch, body.key)))


@router.post("/num_keys")
async def num_keys(body: RoundRequest, svc: ServicesDep) -> CountResponse:
    return CountResponse(count=await svc.kv.count(Rendezvous.round_prefix(body.epoch)))
