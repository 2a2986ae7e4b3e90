"""The key-value interface behind the torch.distributed Store the workers use.

Semantics follow c10d's TCPStore: values are bytes; `add` stores the counter as its decimal
ASCII text and keeps it within int64; `compare_set` on a missing key sets it only when
`expected` is empty. Each round's keys live under their own prefix
(`Rendezvous.round_prefix`), so one round never sees another's.

Implementation: `MemoryKeyValueStore` (`memory_store.py`), with every state backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class KeyValueStore(ABC):
    """An async key-value store on the driver's event loop. Every wait returns by its
    timeout, never hangs."""

    @abstractmethod
    async def set(self, key: str, value: bytes) -> None:
        """Store a value and wake every waiter on its key.

        Args:
            key: the key, replaced if it exists.
            value: the bytes to store.
        """

    @abstractmethod
    async def get(self, key: str, timeout: float) -> bytes | None:
        """Read a value, waiting for it to be set.

        Args:
            key: the key to read.
            timeout: seconds to wait for the key to be set (0: do not wait).

        Returns:
            The value, or None if the key is still missing after `timeout`.
        """

    @abstractmethod
    async def add(self, key: str, amount: int) -> int:
        """Add to the integer counter at a key (a missing key counts as 0).

        Args:
            key: the counter's key.
            amount: what to add (negative subtracts).

        Returns:
            The counter's new value.

        Raises:
            ValueError: the key holds something that is not an integer, or the sum would
                leave the int64 range (`INT64_MIN`..`INT64_MAX`, the range of c10d's
                counters). The key is left as it was.
        """

    @abstractmethod
    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set a key to `desired` if it holds `expected` (or is missing and `expected` is b"").

        Args:
            key: the key to compare and set.
            expected: the value it must hold; b"" also matches a missing key.
            desired: the value it gets when it matches.

        Returns:
            The value the key holds afterwards; for a missing key and a non-empty `expected`,
            `expected`, as c10d answers (the key stays missing).
        """

    @abstractmethod
    async def check(self, keys: list[str]) -> bool:
        """Whether every key exists, now; never waits.

        Args:
            keys: the keys to look for.

        Returns:
            True when every one of `keys` exists.
        """

    @abstractmethod
    async def wait(self, keys: list[str], timeout: float) -> bool:
        """Wait until every key exists.

        Args:
            keys: the keys to wait for.
            timeout: seconds to wait at most.

        Returns:
            True once every key exists; False if one is still missing after `timeout`.
        """

    @abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete a key.

        Args:
            key: the key to delete.

        Returns:
            True if it existed.
        """

    @abstractmethod
    async def count(self, prefix: str) -> int:
        """Count the keys under a prefix.

        Args:
            prefix: the start of the keys to count ("" counts every key).

        Returns:
            The number of keys that start with `prefix`.
        """

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under a prefix (an old round's namespace).

        Args:
            prefix: the start of the keys to delete.

        Returns:
            How many keys were deleted.
        """
