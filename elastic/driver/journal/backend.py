"""Where a job's durable state lives: one small interface, a module per backend.

A driver `claim`s its job (at most one driver holds a job at a time), `load`s what an earlier
driver of the job saved, `save`s documents while it holds the claim, and `release`s the claim
when the job ends. Documents are named by `elastic.protocol.etcd.KEY_NAMES` and hold JSON (a
MAC, for `spec_mac`, `state_mac` and `token_check`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from elastic.errors import ElasticError


class BackendError(ElasticError):
    """The backend stayed unreachable for the retry budget of one call."""


class JobLocked(ElasticError):
    """Another live driver holds the job."""


class ClaimLost(ElasticError):
    """This driver no longer holds the job (its lease expired; another driver may run it)."""


class StateBackend(ABC):
    """The state of one job. Every method retries transient failures for a bounded time and
    then raises `BackendError`; none hangs.

    Implementations: `MemoryBackend` (`memory.py`, the default: lost with the driver) and
    `EtcdBackend` (`etcd.py`: outlives it, so a restarted driver resumes the job).
    """

    durable: bool = False
    """Whether the state outlives the driver (a restarted driver can resume the job)."""

    @abstractmethod
    async def claim(
        self,
        job_id: str,
        holder: str,
        is_alive: Callable[[bytes], bool],
        on_lost: Callable[[], None],
    ) -> None:
        """Take a job for this driver: at most one driver holds a job at a time.

        Args:
            job_id: the job to claim.
            holder: a JSON description of this driver, which later claimants read.
            is_alive: asked about another driver's `holder` when it holds the job: True
                (it lives) refuses this claim; False takes its claim over, at once or once
                its lease ends.
            on_lost: called once, on the event loop, if this claim is lost later (its
                lease expired and another driver may run the job).

        Raises:
            JobLocked: a live driver holds the job.
            BackendError: the backend stayed unreachable.
        """

    @abstractmethod
    async def load(self) -> dict[str, bytes]:
        """Read the claimed job's documents.

        Returns:
            Every document of the claimed job, by name (empty for a new job).

        Raises:
            BackendError: the backend stayed unreachable.
        """

    @abstractmethod
    async def save(
        self, documents: dict[str, bytes], *, expiring: frozenset[str] = frozenset()
    ) -> None:
        """Write documents of the claimed job, all or none, while the claim holds.

        Args:
            documents: the documents to write, by name; others stay as they are.
            expiring: names among them bound to the claim: they vanish when it does.

        Raises:
            ClaimLost: this driver no longer holds the job; nothing was written.
            BackendError: the backend stayed unreachable.
        """

    @abstractmethod
    async def read(self, job_id: str) -> dict[str, bytes]:
        """Read any job's documents, claimed or not (for `elasticrun status`).

        Args:
            job_id: the job to read.

        Returns:
            Every document of the job, by name (empty when there is no such job).

        Raises:
            BackendError: the backend stayed unreachable.
        """

    @abstractmethod
    async def release(self) -> None:
        """Give the claim up (the job ended); the documents stay. Never raises."""

    async def close(self) -> None:  # noqa: B027 - nothing to close by default
        """Release connections. Idempotent."""

    def key_of(self, name: str) -> str:
        """Where a document lives, for messages.

        Args:
            name: a document's name.

        Returns:
            Where document `name` of the claimed job lives (its etcd key, or its name).
        """
        return name
