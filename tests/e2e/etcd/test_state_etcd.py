"""The etcd backend against a real etcd server (started by the fixture on loopback)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import pytest

from elastic.driver.journal.backend import BackendError, ClaimLost, JobLocked
from elastic.driver.journal.etcd import EtcdBackend
from elastic.protocol.etcd import EtcdOptions, parse_endpoints
from tests.support.etcd_server import EtcdServer, JobLock


def options(etcd: EtcdServer) -> EtcdOptions:
    return EtcdOptions(parse_endpoints(etcd.endpoint), prefix="/test")


def backend(etcd: EtcdServer, retry_for: float = 5.0, lease_ttl: int = 10) -> EtcdBackend:
    return EtcdBackend(options(etcd), retry_for, lease_ttl)


def holder(name: str) -> str:
    return json.dumps({"driver_id": name})


def never_lost() -> None:
    raise AssertionError("the claim was lost")


def test_documents_survive_the_driver_and_an_etcd_crash(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        first = backend(etcd)
        await first.claim("job1", holder("a"), lambda _: True, never_lost)
        assert await first.load() == {}
        await first.save({"spec": b'{"np": 2}', "state": b'{"epoch": 3}'})
        await first.close()  # the driver dies without releasing

        etcd.stop()  # SIGKILL: only what etcd acknowledged may survive
        etcd.start()

        second = backend(etcd)
        await second.claim("job1", holder("b"), lambda _: False, never_lost)  # a is dead
        assert await second.load() == {"spec": b'{"np": 2}', "state": b'{"epoch": 3}'}
        await second.release()
        await second.close()

    asyncio.run(scenario())


def test_a_live_holder_refuses_a_second_driver(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        first, second = backend(etcd), backend(etcd)
        await first.claim("job1", holder("a"), lambda _: True, never_lost)
        with pytest.raises(JobLocked, match='"a"'):
            await second.claim("job1", holder("b"), lambda _: True, never_lost)
        # Another job is independent.
        await second.claim("job2", holder("b"), lambda _: True, never_lost)
        await first.release()
        await second.release()
        third = backend(etcd)
        await third.claim("job1", holder("c"), lambda _: True, never_lost)  # free again
        await third.release()
        for b in (first, second, third):
            await b.close()

    asyncio.run(scenario())


def test_a_driver_that_lost_its_claim_cannot_overwrite_its_successor(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        lost: list[bool] = []
        old, new = backend(etcd), backend(etcd)
        await old.claim("job1", holder("old"), lambda _: True, lambda: lost.append(True))
        await new.claim("job1", holder("new"), lambda _: False, never_lost)  # takes over
        await new.save({"state": b"new"})
        with pytest.raises(ClaimLost):
            await old.save({"state": b"old"})
        assert lost == [True]
        assert (await new.read("job1"))["state"] == b"new"
        await new.release()
        for b in (old, new):
            await b.close()

    asyncio.run(scenario())


def test_expiring_documents_vanish_with_the_claim(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        driver = backend(etcd)
        await driver.claim("job1", holder("a"), lambda _: True, never_lost)
        await driver.save({"driver": b"addr", "state": b"s"}, expiring=frozenset({"driver"}))
        await driver.release()
        documents = await driver.read("job1")
        assert "driver" not in documents and "lock" not in documents
        assert documents["state"] == b"s"
        await driver.close()

    asyncio.run(scenario())


def test_an_unreachable_etcd_raises_within_the_budget(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        driver = backend(etcd, retry_for=1.0)
        await driver.claim("job1", holder("a"), lambda _: True, never_lost)
        etcd.stop()
        with pytest.raises(BackendError, match="unreachable for 1 s"):
            await driver.save({"state": b"s"})
        etcd.start()
        await driver.save({"state": b"s2"})  # catches up once etcd is back
        assert (await driver.read("job1"))["state"] == b"s2"
        await driver.release()
        await driver.close()

    asyncio.run(scenario())


# --- a claim whose lease ended while its driver lived --------------------------------------


async def until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


TAKEN_BACK = "no other driver held it: taken back"


def test_a_driver_whose_lease_was_revoked_takes_its_claim_back(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease ends (revoked here) while nobody else claims the job: at its next refresh
    the driver takes the lock back under a new lease, with the expiring documents."""
    caplog.set_level(logging.WARNING, "elastic.driver.journal.etcd")

    async def scenario() -> None:
        driver, lock = backend(etcd), JobLock(etcd, "job1", prefix="/test")
        await driver.claim("job1", holder("a"), lambda _: True, never_lost)
        await driver.save({"driver": b"addr", "state": b"s"}, expiring=frozenset({"driver"}))
        old = await asyncio.to_thread(lock.end_lease)
        assert "driver" not in await driver.read("job1")
        await until(lambda: lock.held()[0] is not None, timeout=10)  # a refresh: every 2 s
        value, lease = await asyncio.to_thread(lock.held)
        assert value == holder("a").encode() and lease not in (0, old)
        assert (await driver.read("job1"))["driver"] == b"addr"
        assert TAKEN_BACK in caplog.text
        await driver.save({"state": b"s2"})  # it carries on
        await driver.release()
        await driver.close()
        lock.close()

    asyncio.run(scenario())


def test_a_save_finds_the_lease_ended_and_takes_the_claim_back(etcd: EtcdServer) -> None:
    async def scenario() -> None:
        driver, lock = backend(etcd), JobLock(etcd, "job1", prefix="/test")
        await driver.claim("job1", holder("a"), lambda _: True, never_lost)
        await asyncio.to_thread(lock.end_lease)
        await driver.save({"state": b"s"})  # before the next refresh: the save sees it
        assert (await asyncio.to_thread(lock.held))[0] == holder("a").encode()
        assert (await driver.read("job1"))["state"] == b"s"
        await driver.release()
        await driver.close()
        lock.close()

    asyncio.run(scenario())


def test_a_driver_whose_loop_was_blocked_past_its_lease_takes_its_claim_back(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's own event loop stops for longer than the lease (a 3 s lease here): no
    refresh reaches etcd, the lease ends; once the loop runs again the claim is taken back."""
    caplog.set_level(logging.WARNING, "elastic.driver.journal.etcd")

    async def scenario() -> None:
        driver, lock = backend(etcd, lease_ttl=3), JobLock(etcd, "job1", prefix="/test")
        await driver.claim("job1", holder("a"), lambda _: True, never_lost)
        _, before = await asyncio.to_thread(lock.held)
        time.sleep(5.0)  # blocks the loop: the test stands for a driver stuck in a call
        assert await asyncio.to_thread(lock.held) == (None, 0)  # the lease ended meanwhile
        await until(lambda: lock.held()[0] is not None, timeout=10)
        value, after = await asyncio.to_thread(lock.held)
        assert value == holder("a").encode() and after != before
        assert TAKEN_BACK in caplog.text
        await driver.save({"state": b"s"})
        await driver.release()
        await driver.close()
        lock.close()

    asyncio.run(scenario())


def test_a_driver_whose_claim_another_took_meanwhile_lets_it_go(etcd: EtcdServer) -> None:
    """The lease ends and another driver claims the job before this one notices: this one
    is told once (`on_lost`), saves nothing more and leaves the lock alone."""

    async def scenario() -> None:
        lost: list[bool] = []
        driver, lock = backend(etcd), JobLock(etcd, "job1", prefix="/test")
        await driver.claim("job1", holder("a"), lambda _: True, lambda: lost.append(True))
        await asyncio.to_thread(lock.end_lease)
        await asyncio.to_thread(lock.put, holder("b"))
        await until(lambda: bool(lost), timeout=10)  # its next refresh finds the lock taken
        with pytest.raises(ClaimLost):
            await driver.save({"state": b"a"})
        await driver.release()
        assert lost == [True]
        assert (await asyncio.to_thread(lock.held))[0] == holder("b").encode()
        assert "state" not in await driver.read("job1")
        await driver.close()
        lock.close()

    asyncio.run(scenario())
