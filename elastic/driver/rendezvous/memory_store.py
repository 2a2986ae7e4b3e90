"""The rendezvous key-value store: the torch Store's keys in the driver's memory.

They live here with every state backend (memory or etcd): they belong to one round's group
formation, and a restarted driver forms a new round before anyone needs them.
"""

from __future__ import annotations

from elastic.driver.changes import ChangeNotifier
from elastic.driver.rendezvous.store import INT64_MAX, INT64_MIN, KeyValueStore


class MemoryKeyValueStore(KeyValueStore):
    """`KeyValueStore` as a dict plus a change notifier (see `KeyValueStore` for each
    method's contract); every method runs on the driver's event loop. Lost with the driver:
    a restarted one forms a new round before anyone needs the old keys."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._changes = ChangeNotifier()

    async def set(self, key: str, value: bytes) -> None:
        self._data[key] = value
        self._changes.notify()

    async def get(self, key: str, timeout: float) -> bytes | None:
        await self._changes.wait_until(lambda: key in self._data, timeout)
        return self._data.get(key)

    async def add(self, key: str, amount: int) -> int:
        raw = self._data.get(key, b"0")
        try:
            value = int(raw) + amount
        except ValueError:
            raise ValueError(f"key {key!r} does not hold an integer") from None
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"adding {amount} to key {key!r} would leave the int64 range")
        self._data[key] = str(value).encode()
        self._changes.notify()
        return value

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self._data.get(key)
        if current is None and expected:
            return expected
        if current is None or current == expected:
            self._data[key] = desired
            self._changes.notify()
            return desired
        return current

    async def check(self, keys: list[str]) -> bool:
        return all(k in self._data for k in keys)

    async def wait(self, keys: list[str], timeout: float) -> bool:
        return await self._changes.wait_until(lambda: all(k in self._data for k in keys), timeout)

    async def delete(self, key: str) -> bool:
        existed = self._data.pop(key, None) is not None
        if existed:
            self._changes.notify()
        return existed

    async def count(self, prefix: str) -> int:
        return sum(1 for k in self._data if k.startswith(prefix))

    async def delete_prefix(self, prefix: str) -> int:
        doomed = [k for k in self._data if k.startswith(prefix)]
        for key in doomed:
            del self._data[key]
        return len(doomed)
