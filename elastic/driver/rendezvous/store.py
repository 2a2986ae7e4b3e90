"""The key-value interface behind the torch.distributed Store the workers use.

Semantics follow c10d's TCPStore: values are bytes; `add` stores the counter as its decimal
ASCII text and keeps it within int64; `compare_set` on a missing key sets it only when
`expected` is empty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class KeyValueStore(ABC):
    """An async key-value store; every wait returns by its timeout, never hangs."""

    @abstractmethod
    async def set(self, key: str, value: bytes) -> None:
        """Store `value` under `key` and wake every waiter on it."""

    @abstractmethod
    async def get(self, key: str, timeout: float) -> bytes | None:
        """Return the value, waiting up to `timeout` seconds for it; None if still missing."""

    @abstractmethod
    async def add(self, key: str, amount: int) -> int:
        """Add `amount` to the integer at `key` (missing counts as 0); return the new value.

        Raises ValueError, leaving the key as it was, if the key holds something that is not
        an integer or if the sum would leave the int64 range (`INT64_MIN`..`INT64_MAX`, the
        range of c10d's counters).
        """

    @abstractmethod
    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set `desired` if the current value is `expected` (or missing and `expected` is b"").

        Returns the value the key holds afterwards (for a missing key and a non-empty
        `expected`: `expected`, as c10d does).
        """

    @abstractmethod
    async def check(self, keys: list[str]) -> bool:
        """True when every key exists. Never waits."""

    @abstractmethod
    async def wait(self, keys: list[str], timeout: float) -> bool:
        """Wait up to `timeout` seconds until every key exists; False on timeout."""

    @abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""

    @abstractmethod
    async def count(self, prefix: str) -> int:
        """Number of keys that start with `prefix`."""

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` (an old round's namespace); return how many."""
