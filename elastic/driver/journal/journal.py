"""The job's journal: what outlives this driver, in the state backend."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.errors import LaunchError
from elastic.driver.journal.backend import BackendError, JobLocked, StateBackend
from elastic.driver.journal.etcd import EtcdBackend
from elastic.driver.journal.memory import MemoryBackend
from elastic.driver.journal.record import JobResult, JobSpec
from elastic.driver.journal.resume import describe_holder, holder_alive, holder_description
from elastic.driver.journal.saver import StateSaver
from elastic.driver.settings import BackendSettings
from elastic.protocol.etcd import SEALED, DriverAddress, mac_key
from elastic.protocol.etcd_trust import document_mac, token_check


def backend_for(settings: BackendSettings) -> StateBackend:
    """The backend the settings name: etcd when its endpoints are given, else memory."""
    if settings.etcd is not None:
        return EtcdBackend(settings.etcd)
    return MemoryBackend()


def sealed(documents: dict[str, bytes], token: str, job_id: str) -> dict[str, bytes]:
    """`documents` with the MAC of each one a restarted driver acts on (`spec`, `state`)
    under `token`, to save in the same transaction."""
    macs = {
        mac_key(name): document_mac(token, job_id, name, value).encode()
        for name, value in documents.items()
        if name in SEALED
    }
    return {**documents, **macs}


class JobJournal:
    """Claims the job in the backend, publishes this driver's address (and a new job's spec),
    saves the job's state as it changes and records how the job ended.

    With the memory backend every call is cheap and nothing outlives the driver. With etcd a
    save never blocks the driver: `save_soon` asks a `StateSaver` that rides out outages,
    and `flush` waits (briefly) for the newest state to be saved. `on_lost()` is called when
    another driver took the job over; from then on nothing is saved.

    No token is saved: `spec` and `state` go with their MACs under it (`sealed`), the driver's
    address is signed with it, and `token_check` lets a restarted driver tell a wrong token.
    """

    def __init__(
        self,
        backend: StateBackend,
        job_id: str,
        driver_id: str,
        grace: float,
        on_lost: Callable[[], None],
    ) -> None:
        self.backend = backend
        self._job_id = job_id
        self._driver_id = driver_id
        self._grace = grace
        self._on_lost = on_lost
        self._saver: StateSaver | None = None
        self._token = ""  # set by `publish`

    @property
    def durable(self) -> bool:
        return self.backend.durable

    async def claim(self) -> dict[str, bytes]:
        """Take the job and return what an earlier driver saved of it.

        Raises `LaunchError` when another live driver holds the job, the backend cannot be
        reached, or the job has already ended (its result is saved)."""
        try:
            await self.backend.claim(
                self._job_id, holder_description(self._driver_id), holder_alive, self._on_lost
            )
            documents = await self.backend.load()
        except JobLocked as err:
            expiry = " (if that driver died, its claim expires within 10 s)"
            raise LaunchError(
                f"job {self._job_id} is already run by {describe_holder(str(err))}; "
                "one job takes one driver" + (expiry if self.durable else "")
            ) from None
        except BackendError as err:
            raise LaunchError(f"cannot reach the state backend: {err}") from None
        if "result" in documents:
            await self.backend.release()
            ended = JobResult.model_validate_json(documents["result"])
            raise LaunchError(
                f"job {self._job_id} already ended with exit code {ended.code}"
                + (f": {ended.message}" if ended.message else "")
            )
        return documents

    async def publish(
        self,
        address: DriverAddress,
        token: str,
        spec: JobSpec | None,
        snapshot: Callable[[], bytes],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        """Save this driver's address signed with `token` (it expires with the claim) and the
        token's check; for a new job its `spec` and first state; then keep `snapshot()` saved
        (a task, via `spawn`). Raises `LaunchError` when the backend refuses."""
        self._token = token
        documents = {
            "driver": address.signed(token, self._job_id).model_dump_json().encode(),
            "token_check": token_check(token, self._job_id).encode(),
        }
        if spec is not None:
            documents["spec"] = spec.model_dump_json().encode()
            documents["state"] = snapshot()
        try:
            await self.backend.save(self.sealed(documents), expiring=frozenset({"driver"}))
        except BackendError as err:
            raise LaunchError(f"cannot save the job in the state backend: {err}") from None
        if self.backend.durable:
            self._saver = StateSaver(
                self.backend, snapshot, self._grace, self._on_lost, seal=self.sealed
            )
            spawn(self._saver.run())

    def sealed(self, documents: dict[str, bytes]) -> dict[str, bytes]:
        """`documents` with their MACs under this job's token (see `sealed`)."""
        return sealed(documents, self._token, self._job_id)

    def save_soon(self) -> None:
        """Save the state as soon as the backend takes it (no-op before `publish`)."""
        if self._saver is not None:
            self._saver.request()

    async def flush(self) -> None:
        """Wait (briefly) until the state the workers are about to be told is saved."""
        if self._saver is not None:
            await self._saver.flush()

    async def record_result(self, code: int, message: str, snapshot: bytes) -> None:
        """Save how the job ended, with its last state; a backend that is down loses it."""
        result = JobResult(code=code, message=message, ended=time.time())
        with contextlib.suppress(BackendError):
            await self.backend.save(
                self.sealed({"state": snapshot, "result": result.model_dump_json().encode()})
            )

    async def close(self) -> None:
        """Give the claim up and close the backend."""
        await self.backend.release()
        await self.backend.close()
