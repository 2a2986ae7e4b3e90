"""The driver's event loop is never blocked by a slow peer: etcd frozen (SIGSTOP) for seconds,
or a host name lookup that takes long. A watch coroutine measures how late the loop wakes it;
blocking calls made on the loop would show as a lateness of a whole call (2 s for etcd)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from typing import Any

import pytest

from elastic.driver.errors import UsageError
from elastic.driver.journal.backend import BackendError
from elastic.driver.journal.etcd import EtcdBackend
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.ssh import SshOptions
from elastic.protocol.etcd import EtcdOptions, parse_endpoints
from tests.support.etcd_server import EtcdServer

BLOCKED = 0.2  # seconds of lateness that count as a blocked loop
TICK = 0.02


class LoopWatch:
    """Wakes every `TICK` s and keeps the longest lateness seen."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(TICK)
            self.worst = max(self.worst, time.monotonic() - start - TICK)

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._watch())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_a_frozen_etcd_does_not_block_the_loop(etcd: EtcdServer) -> None:
    """etcd stopped (SIGSTOP) for 5 s: the keep-alive, a save and a read time out in threads
    while the loop runs on; afterwards the claim still holds (5 s is within the lease)."""
    assert etcd.process is not None
    driver = EtcdBackend(EtcdOptions(parse_endpoints(etcd.endpoint), prefix="/test"), 3.0)

    def lost() -> None:
        raise AssertionError("the claim was lost")

    async def scenario() -> None:
        await driver.claim("job1", '{"driver_id": "a"}', lambda _: True, lost)
        await driver.save({"state": b"before"})
        with LoopWatch() as watch:
            os.kill(etcd.process.pid, signal.SIGSTOP)
            try:
                outcomes = await asyncio.gather(
                    driver.save({"state": b"frozen"}),
                    driver.read("job1"),
                    asyncio.sleep(5.0),  # the keep-alive refreshes (and times out) meanwhile
                    return_exceptions=True,
                )
            finally:
                os.kill(etcd.process.pid, signal.SIGCONT)
            assert all(isinstance(outcome, BackendError) for outcome in outcomes[:2]), outcomes
            await driver.save({"state": b"after"})
        print(f"\nlongest loop lateness with etcd frozen: {watch.worst * 1000:.0f} ms")
        assert watch.worst < BLOCKED
        assert (await driver.read("job1"))["state"] == b"after"
        await driver.release()
        await driver.close()

    asyncio.run(scenario())


def test_host_name_lookups_do_not_block_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lookup takes 1 s (DNS slow); `learn` makes them in threads, and the answers are
    then given from memory, a name that does not resolve included."""
    real = socket.getaddrinfo
    slow = {"slow-a.invalid", "slow-b.invalid", "slow-c.invalid"}

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in slow:
            time.sleep(1.0)
            if host == "slow-c.invalid":
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    hosts = HostAccess(SshOptions(), stop_grace=1.0, ssh_timeout=1.0)

    async def scenario() -> None:
        with LoopWatch() as watch:
            await hosts.learn(["slow-a.invalid", "slow-b.invalid", "slow-c.invalid", "localhost"])
        print(f"\nlongest loop lateness during slow lookups: {watch.worst * 1000:.0f} ms")
        assert watch.worst < BLOCKED
        started = time.monotonic()
        assert hosts.is_local("slow-a.invalid") and hosts.is_local("localhost")
        assert hosts.usable("slow-b.invalid")
        assert not hosts.usable("slow-c.invalid")
        with pytest.raises(UsageError, match="unknown host 'slow-c.invalid'"):
            hosts.is_local("slow-c.invalid")
        assert time.monotonic() - started < BLOCKED, "answered from memory"

    asyncio.run(scenario())
