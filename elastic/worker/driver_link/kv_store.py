"""A `torch.distributed.Store` over the driver's KV API, bound to one round's namespace."""

from __future__ import annotations

import base64
import time
from datetime import timedelta

import torch.distributed as dist

from elastic.protocol.http import (
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
from elastic.worker.driver_link.http_client import DriverClient, KeyNotFound

_POLL = 30.0  # longest single long-poll; a longer wait is several polls


def _b64(value: bytes | str) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    return base64.b64encode(raw).decode()


class DriverStore(dist.Store):
    """Every key lives under round `round_`; a new round's store never sees old keys. With a
    `prefix`, every key of this store starts with it (a later group of the same round keys
    its rendezvous apart from the earlier ones': `elastic.worker.group.formation`).

    Blocking calls (`get`, `wait`) raise `TimeoutError` after the store timeout, like c10d's
    stores; a driver that stays unreachable past the client's retry budget raises DriverError.
    """

    def __init__(
        self, client: DriverClient, round_: int, timeout: timedelta, prefix: str = ""
    ) -> None:
        super().__init__()
        self._client = client
        self._round = round_  # the requests' `epoch` field: the wire's old name for a round
        self._timeout = timeout
        self._prefix = prefix

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set(self, key: str, value: bytes | str) -> None:
        request = SetRequest(epoch=self._round, key=self._prefix + key, value=_b64(value))
        self._client.post("/v1/kv/set", request, CheckResponse)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self._timeout.total_seconds()
        while True:
            poll = max(0.0, min(_POLL, deadline - time.monotonic()))
            request = GetRequest(epoch=self._round, key=self._prefix + key, timeout=poll)
            try:
                answer = self._client.post("/v1/kv/get", request, ValueResponse, wait=poll)
                return base64.b64decode(answer.value)
            except KeyNotFound:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"key {key!r} of round {self._round} not set within "
                        f"{self._timeout.total_seconds():g} s"
                    ) from None

    def add(self, key: str, amount: int) -> int:
        request = AddRequest(epoch=self._round, key=self._prefix + key, amount=amount)
        return self._client.post("/v1/kv/add", request, AddResponse).value

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        request = CompareSetRequest(
            epoch=self._round,
            key=self._prefix + key,
            expected=_b64(expected),
            desired=_b64(desired),
        )
        answer = self._client.post("/v1/kv/compare_set", request, ValueResponse)
        return base64.b64decode(answer.value)

    def check(self, keys: list[str]) -> bool:
        request = KeysRequest(epoch=self._round, keys=[self._prefix + key for key in keys])
        return self._client.post("/v1/kv/check", request, CheckResponse).ready

    def delete_key(self, key: str) -> bool:
        request = KeyRequest(epoch=self._round, key=self._prefix + key)
        return self._client.post("/v1/kv/delete", request, DeleteResponse).deleted

    def num_keys(self) -> int:
        request = RoundRequest(epoch=self._round)
        return self._client.post("/v1/kv/num_keys", request, CountResponse).count

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Wait for `keys`, at least this store's own timeout (Gloo passes its connection
        timeout, shorter: see `create_group`), and `RoundSuperseded` once a newer round forms."""
        limit = max(timeout or self._timeout, self._timeout).total_seconds()
        deadline = time.monotonic() + limit
        prefixed = [self._prefix + key for key in keys]
        while True:
            poll = max(0.0, min(_POLL, deadline - time.monotonic()))
            request = WaitRequest(epoch=self._round, keys=prefixed, timeout=poll)
            if self._client.post("/v1/kv/wait", request, CheckResponse, wait=poll).ready:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"keys {keys} of round {self._round} not set within {limit:g} s")
