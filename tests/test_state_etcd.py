"""The etcd backend against a real etcd server (started by the fixture on loopback)."""

from __future__ import annotations

import asyncio
import json

import pytest

from elastic.driver.journal.backend import BackendError, ClaimLost, JobLocked
from elastic.driver.journal.etcd import EtcdBackend
from elastic.protocol.etcd import EtcdOptions, parse_endpoints
from tests.etcd_server import EtcdServer


def backend(etcd: EtcdServer, retry_for: float = 5.0) -> EtcdBackend:
    return EtcdBackend(EtcdOptions(parse_endpoints(etcd.endpoint), prefix="/test"), retry_for)


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
