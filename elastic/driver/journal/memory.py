"""The default backend: job state in the driver's memory (no setup, lost with the driver).

A claim holds the job id on this host (`elastic.driver.job_file.claim_job_id`): a second
driver started with a running job's id is refused, as the etcd backend refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from elastic.driver.job_file import JobIdClaim, JobIdTaken, claim_job_id
from elastic.driver.journal.backend import JobLocked, StateBackend


class MemoryBackend(StateBackend):
    """`StateBackend` in the driver's memory (see `StateBackend` for each method's
    contract): job state that lives as long as the driver, nothing to set up or resume.

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
