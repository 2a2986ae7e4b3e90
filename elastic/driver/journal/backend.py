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
    then raises `BackendError`; none hangs."""

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
        """Take job `job_id` for this driver (`holder`: a JSON description of it).

        When another driver holds it, `is_alive(that_holder)` decides: a live one makes this
        raise `JobLocked`; a dead one's claim is taken over (at once, or once its lease ends).
        `on_lost()` is called, once, if the claim is lost later.
        """

    @abstractmethod
    async def load(self) -> dict[str, bytes]:
        """Every document of the claimed job (empty for a new job)."""

    @abstractmethod
    async def save(
        self, documents: dict[str, bytes], *, expiring: frozenset[str] = frozenset()
    ) -> None:
        """Write `documents` atomically, only while the claim holds (else `ClaimLost`).

        Names in `expiring` are bound to the claim: they vanish when the claim does.
        """

    @abstractmethod
    async def read(self, job_id: str) -> dict[str, bytes]:
        """Every document of any job, claimed or not (for `elasticrun status`)."""

    @abstractmethod
    async def release(self) -> None:
        """Give the claim up (the job ended); documents stay. Never raises."""

    async def close(self) -> None:  # noqa: B027 - nothing to close by default
        """Release connections. Idempotent."""

    def key_of(self, name: str) -> str:
        """Where document `name` of the claimed job lives, for messages."""
        return name
