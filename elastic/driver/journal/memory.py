"""The default backend: job state in the driver's memory (no setup, lost with the driver).

A claim holds the job id on this host (`elastic.driver.job_file.claim_job_id`): a second
driver started with a running job's id is refused, as the etcd backend refuses it.

The torch Store's keys (`MemoryKeyValueStore`) live here with every backend: they belong to one
epoch's group formation, and a restarted driver forms a new epoch before anyone needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from elastic.driver.changes import ChangeNotifier
from elastic.driver.job_file import JobIdClaim, JobIdTaken, claim_job_id
from elastic.driver.journal.backend import JobLocked, StateBackend
from elastic.driver.rendezvous.kv import INT64_MAX, INT64_MIN, KeyValueStore


class MemoryKeyValueStore(KeyValueStore):
    """A dict plus a change notifier; all methods run on the driver's event loop."""

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


class MemoryBackend(StateBackend):
    """Job state that lives as long as the driver: nothing to set up, nothing to resume.

    `claim` holds the job id on this host for as long as the claim (the lock file lives in
    `runtime_folder`, default: the job files' folder); a live driver holding it makes `claim`
    raise `JobLocked` with that driver's description.
    """

    durable = False

    def __init__(self, runtime_folder: Path | None = None) -> None:
        self._documents: dict[str, dict[str, bytes]] = {}
        self._job_id: str | None = None
        self._runtime_folder = runtime_folder
        self._id_claim: JobIdClaim | None = None

    async def claim(
        self,
        job_id: str,
        holder: str,
        is_alive: Callable[[bytes], bool],
        on_lost: Callable[[], None],
    ) -> None:
        if self._id_claim is None or self._job_id != job_id:
            try:
                claim = claim_job_id(job_id, holder, self._runtime_folder)
            except JobIdTaken as taken:
                raise JobLocked(str(taken)) from None
            if self._id_claim is not None:
                self._id_claim.release()
            self._id_claim = claim
        self._job_id = job_id
        self._documents.setdefault(job_id, {})["lock"] = holder.encode()

    async def load(self) -> dict[str, bytes]:
        assert self._job_id is not None, "claim() first"
        return {k: v for k, v in self._documents[self._job_id].items() if k != "lock"}

    async def save(
        self, documents: dict[str, bytes], *, expiring: frozenset[str] = frozenset()
    ) -> None:
        assert self._job_id is not None, "claim() first"
        self._documents[self._job_id].update(documents)

    async def read(self, job_id: str) -> dict[str, bytes]:
        return dict(self._documents.get(job_id, {}))

    async def release(self) -> None:
        if self._job_id is not None:
            self._documents[self._job_id].pop("lock", None)
        if self._id_claim is not None:
            self._id_claim.release()
            self._id_claim = None
