"""Putting workers on slots and starting each worker (where the first round's go is
`policy.planning.first_places`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from elastic.driver.errors import LaunchError
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.standbys import TakenStandby
from elastic.driver.policy.end_causes import NOT_STARTED
from elastic.driver.workers import Worker, WorkerState

log = logging.getLogger("elasticrun")

STARTS_AT_ONCE = 64  # worker starts in flight together

Places = Sequence[tuple[str, int]]  # (hostname, slot index) pairs


class Staffing:
    """Creates the job's workers on places and starts their processes.

    `environment(worker)` gives a worker's variables. In an elastic job a worker that
    cannot be started on a remote host has failed and its host is reported to
    `host_failed(hostname, why)`, as is a host that ssh cannot reach; any other failure to
    start raises `LaunchError` (the command cannot run here: trying again would not help).
    """

    def __init__(
        self,
        fleet: Fleet,
        hosts: HostAccess,
        command: Sequence[str],
        environment: Callable[[Worker], dict[str, str]],
        elastic: bool,
        host_failed: Callable[[str, str], None],
    ) -> None:
        self._fleet = fleet
        self._hosts = hosts
        self._command = list(command)
        self._environment = environment
        self._elastic = elastic
        self._host_failed = host_failed

    async def place(self, places: Places) -> list[Worker]:
        """Records for workers on `places`, every host checked reachable first (one that is
        not raises `LaunchError`): the first round, formed before any of them starts."""
        await self._hosts.check_reachable({hostname for hostname, _ in places}, fatal=True)
        return [self._fleet.new_worker(hostname, slot) for hostname, slot in places]

    async def start(self, worker: Worker) -> None:
        """Start `worker`'s process; a failure to start fails the worker (see the class)."""
        try:
            await self._fleet.start(worker, self._command, self._environment(worker))
        except LaunchError as err:
            if not self._elastic or self._hosts.is_local(worker.hostname):
                raise
            worker.state, worker.end_cause = WorkerState.FAILED, NOT_STARTED
            log.error("cannot start a worker on host %s: %s", worker.hostname, err,
                      extra={"event": "failure", "host": worker.hostname})  # fmt: skip
            self._host_failed(worker.hostname, str(err))

    async def start_all(self, workers: Sequence[Worker]) -> None:
        """Start `workers`, `STARTS_AT_ONCE` at a time: ssh sessions to many hosts open
        side by side, and workers that started register while others are still starting."""
        for first in range(0, len(workers), STARTS_AT_ONCE):
            batch = workers[first : first + STARTS_AT_ONCE]
            await asyncio.gather(*(self.start(worker) for worker in batch))

    async def grow(self, places: Places, wanted: Callable[[], bool]) -> list[Worker]:
        """Start a worker on each of `places` whose host ssh reaches and that no live worker
        took meanwhile, while `wanted()`; return the workers started."""
        unreachable = await self._hosts.check_reachable({h for h, _ in places}, fatal=False)
        for hostname in unreachable:
            self._host_failed(hostname, "unreachable through ssh")
        started = []
        for hostname, slot in places:
            # Read again at every place: another launch may have taken it meanwhile.
            workers = self._fleet.workers.values()
            taken = {(w.hostname, w.host_slot) for w in workers if w.state.alive}
            if hostname in unreachable or (hostname, slot) in taken:
                continue
            if not wanted():
                break
            worker = self._fleet.new_worker(hostname, slot, standby=True)
            await self.start(worker)
            started.append(worker)
        if started:
            warm = sum(isinstance(worker.process, TakenStandby) for worker in started)
            log.info("launched %d worker(s) on %s%s", len(started), host_summary(started),
                     f" ({warm} in warm standbys)" if warm else "",
                     extra={"event": "launch"})  # fmt: skip
        return started


def host_summary(workers: list[Worker]) -> str:
    """ "host:count, ..." for `workers`, hosts in order of their first worker."""
    counts: dict[str, int] = {}
    for worker in workers:
        counts[worker.hostname] = counts.get(worker.hostname, 0) + 1
    return ", ".join(f"{host}:{count}" for host, count in counts.items())
