"""The fault-tolerant backend: job state in etcd, under `<prefix>/<job_id>/`.

The claim is the `lock` key, bound to a lease that this driver keeps alive: when the driver
dies, its lease ends `LEASE_TTL` seconds later and the claim with it. Every save is a
transaction that first checks the lock still names this driver, so a driver that lost its
claim (a long pause, a partition) can never overwrite its successor's state. A driver whose
lease ended while it lived (etcd frozen or unreachable for longer than the lease, this
driver's own pause) takes the claim back when nobody else took it meanwhile; only a lock
that names another driver means the job is lost.

pyetcd is synchronous: every call (the claim, saves, reads, the lease's keep-alive, closing
the client) runs in this backend's own threads, never on the event loop, each retried
(tenacity) within a bounded time and each attempt bounded by `EtcdOptions.call_timeout`. The
threads are its own so that a frozen etcd (calls that each take the whole timeout) and other
work in the default pool (host name lookups) never wait for one another.

With etcd's authentication on, a login etcd forgot (idle past its `--auth-token-ttl`, or lost
in an etcd restart) is made again by the next attempt; a refusal (wrong password, a user
without access to the prefix) is no outage: it raises `BackendError` at once, saying what to
change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import tenacity
from pyetcd.exceptions import Etcd3Exception

from elastic.driver.journal.backend import BackendError, ClaimLost, JobLocked, StateBackend
from elastic.protocol.etcd import KEY_NAMES, EtcdOptions, connect, login_expired, refusal

log = logging.getLogger(__name__)

LEASE_TTL = 10  # seconds a dead driver's claim outlives it
KEEPALIVE_SHARE = 0.2  # of the lease's TTL between refreshes (2 s for 10 s)
CALL_THREADS = 4  # etcd calls at once: keep-alive, saver, a take-back, a read
T = TypeVar("T")


def _transient(err: BaseException) -> bool:
    return isinstance(err, Etcd3Exception | grpc.RpcError | OSError)


class EtcdBackend(StateBackend):
    """`StateBackend` in etcd (see `StateBackend` for each method's contract): the job's
    documents and its claim outlive the driver, so a restarted one resumes the job."""

    durable = True

    def __init__(
        self, options: EtcdOptions, retry_for: float = 10.0, lease_ttl: int = LEASE_TTL
    ) -> None:
        """`retry_for`: seconds one call retries before `BackendError`; `lease_ttl`: seconds
        the claim outlives this driver's last refresh (refreshed every fifth of it)."""
        self.options = options
        self._retry_for = retry_for
        self._lease_ttl = lease_ttl
        self._keepalive_every = lease_ttl * KEEPALIVE_SHARE
        self._client: Any = None
        self._threads: ThreadPoolExecutor | None = None
        self._job_id: str | None = None
        self._holder = b""
        self._lease_id = 0
        self._keepalive: asyncio.Task[None] | None = None
        self._on_lost: Callable[[], None] | None = None
        self._lost = False
        self._expiring: dict[str, bytes] = {}  # documents bound to the lease, as last saved
        self._reclaiming = asyncio.Lock()

    @property
    def where(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.options.endpoints)

    async def _call(self, work: Callable[[Any], T], retry_for: float | None = None) -> T:
        """Run `work(client)` in one of this backend's threads, retrying transient failures
        for `retry_for` s."""

        def attempt() -> T:
            client = self._client
            try:
                if client is None:
                    client = self._client = connect(self.options)
                return work(client)
            except Exception as err:
                if (refused := refusal(err, self.options)) is not None:
                    raise BackendError(f"etcd at {self.where}: {refused}") from None
                if login_expired(err) and self._client is client and client is not None:
                    self._client = None  # the next attempt logs in again
                    with contextlib.suppress(Exception):
                        client.close()  # calls in flight on it fail and are retried
                raise

        budget = self._retry_for if retry_for is None else retry_for
        try:
            async for attempt_ in tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception(_transient),
                stop=tenacity.stop_after_delay(budget),
                wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
                reraise=True,
            ):
                with attempt_:
                    return await self._in_thread(attempt)
        except Exception as err:
            if _transient(err):
                why = str(err) or type(err).__name__
                raise BackendError(
                    f"etcd at {self.where} unreachable for {budget:g} s: {why}"
                ) from err
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _in_thread(self, work: Callable[[], T]) -> T:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="etcd")
        return await asyncio.get_running_loop().run_in_executor(self._threads, work)

    def key_of(self, name: str) -> str:
        return self._key(name)

    def _key(self, name: str, job_id: str | None = None) -> str:
        job = job_id or self._job_id
        assert job is not None, "claim() first"
        return self.options.job_key(job, name)

    async def claim(
        self,
        job_id: str,
        holder: str,
        is_alive: Callable[[bytes], bool],
        on_lost: Callable[[], None],
    ) -> None:
        self._job_id, self._holder, self._on_lost = job_id, holder.encode(), on_lost
        lease = await self._call(lambda c: c.lease(self._lease_ttl))
        self._lease_id = lease.id
        lock = self._key("lock")
        mine = self._holder

        def take(c: Any) -> tuple[bool, bytes | None]:
            t = c.transactions
            taken, _ = c.transaction(
                compare=[t.create(lock) == 0],
                success=[t.put(lock, mine, lease=self._lease_id)],
                failure=[],
            )
            if taken:
                return True, None
            value, _ = c.get(lock)
            return False, value

        while True:
            taken, other = await self._call(take)
            if taken:
                break
            if other is None:
                continue  # it expired between the two calls
            if is_alive(other):
                raise JobLocked(other.decode(errors="replace"))

            def take_over(c: Any, other: bytes = other) -> bool:
                t = c.transactions
                taken, _ = c.transaction(
                    compare=[t.value(lock) == other],
                    success=[t.put(lock, mine, lease=self._lease_id)],
                    failure=[],
                )
                return taken

            if await self._call(take_over):
                break
        self._keepalive = asyncio.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        """Refresh the lease; a lease etcd no longer knows means the claim is gone."""
        lease_id = self._lease_id
        while True:
            await asyncio.sleep(self._keepalive_every)
            try:
                answers = await self._call(
                    lambda c, lease_id=lease_id: list(c.refresh_lease(lease_id)),
                    retry_for=self._keepalive_every,
                )
            except BackendError:
                continue  # an outage: the saver reports it; etcd renews leases on restart
            if answers and answers[0].TTL <= 0:
                try:
                    if not await self._reclaim(lease_id):
                        return
                except BackendError:
                    continue  # unreachable again: try again at the next refresh
                lease_id = self._lease_id

    async def _reclaim(self, expired_lease: int) -> bool:
        """Lease `expired_lease` ended while this driver lived: take the claim back under a
        new lease (re-binding the expiring documents) if the lock is free or still names
        this driver; False, after `on_lost`, when another driver holds it. Raises
        `BackendError` when etcd cannot be reached to tell."""
        async with self._reclaiming:
            if self._lost:
                return False
            if self._lease_id != expired_lease:
                return True  # taken back already, by a concurrent caller
            lease = await self._call(lambda c: c.lease(self._lease_ttl))
            lock, mine, expiring = self._key("lock"), self._holder, dict(self._expiring)

            def take_back(c: Any) -> bool:
                t = c.transactions
                puts = [t.put(lock, mine, lease=lease.id)] + [
                    t.put(self._key(name), value, lease=lease.id)
                    for name, value in expiring.items()
                ]
                for held in (t.create(lock) == 0, t.value(lock) == mine):
                    taken, _ = c.transaction(compare=[held], success=puts, failure=[])
                    if taken:
                        return True
                return False

            taken = await self._call(take_back)
            if not taken:
                with contextlib.suppress(BackendError):
                    await self._call(lambda c: c.revoke_lease(lease.id), retry_for=2.0)
                self._claim_lost()
                return False
            self._lease_id = lease.id
            log.warning(
                "the claim on job %s had expired (etcd unreachable, or this driver paused, for "
                "longer than its %d s lease); no other driver held it: taken back",
                self._job_id,
                self._lease_ttl,
            )
            return True

    def _claim_lost(self) -> None:
        if not self._lost:
            self._lost = True
            if self._on_lost is not None:
                self._on_lost()

    async def load(self) -> dict[str, bytes]:
        assert self._job_id is not None, "claim() first"
        documents = await self.read(self._job_id)
        documents.pop("lock", None)
        return documents

    async def save(
        self, documents: dict[str, bytes], *, expiring: frozenset[str] = frozenset()
    ) -> None:
        self._expiring.update({name: documents[name] for name in expiring})
        lock, mine = self._key("lock"), self._holder

        def write(c: Any) -> bool:
            t = c.transactions
            puts = [
                t.put(self._key(name), value, lease=self._lease_id if name in expiring else None)
                for name, value in documents.items()
            ]
            saved, _ = c.transaction(compare=[t.value(lock) == mine], success=puts, failure=[])
            return saved

        if self._lost:
            raise ClaimLost(f"job {self._job_id} was claimed by another driver")
        if await self._call(write):
            return
        # The lock no longer names this driver: its lease may have ended while it lived.
        if await self._reclaim(self._lease_id) and await self._call(write):
            return
        self._claim_lost()
        raise ClaimLost(f"job {self._job_id} was claimed by another driver")

    async def read(self, job_id: str) -> dict[str, bytes]:
        prefix = self._key("", job_id)

        def read_all(c: Any) -> dict[str, bytes]:
            found = {}
            for value, meta in c.get_prefix(prefix):
                name = meta.key.decode()[len(prefix) :]
                if name in KEY_NAMES:
                    found[name] = value
            return found

        return await self._call(read_all)

    async def release(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._job_id is None or self._lost:
            return
        lock, mine, lease_id = self._key("lock"), self._holder, self._lease_id

        def give_up(c: Any) -> None:
            t = c.transactions
            c.transaction(
                compare=[t.value(lock) == mine],
                success=[t.delete(lock), t.delete(self._key("driver"))],
                failure=[],
            )
            c.revoke_lease(lease_id)

        with contextlib.suppress(BackendError):
            await self._call(give_up, retry_for=2.0)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await self._in_thread(client.close)
        if self._threads is not None:
            threads, self._threads = self._threads, None
            threads.shutdown(wait=False)
