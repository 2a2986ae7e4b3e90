"""One job's lifecycle: serve the rendezvous, launch every slot, watch workers, end the job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import uuid
from dataclasses import dataclass

from elastic.driver.assignment import assign_slots
from elastic.driver.errors import LaunchError
from elastic.driver.launch.base import Launcher, WorkerProcess, WorkerSpec
from elastic.driver.launch.local import LocalLauncher
from elastic.driver.launch.ssh import SshLauncher
from elastic.driver.network import interface_address, is_local, local_addresses, route_source
from elastic.driver.output import OutputSink, pump
from elastic.driver.rendezvous import Rendezvous
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.services import Services
from elastic.driver.settings import Settings
from elastic.driver.state.memory import MemoryKeyValueStore
from elastic.protocol import env as worker_env
from elastic.protocol.http import HostStatus, JobStatus, SlotInfo, WorkerStatus

log = logging.getLogger("elasticrun")


@dataclass
class Worker:
    slot: SlotInfo
    process: WorkerProcess
    state: str = "launching"
    exit_code: int | None = None


def describe_exit(worker: Worker) -> str:
    code = worker.exit_code
    if worker.process.signal is not None:
        name = signal.Signals(worker.process.signal).name
        return f"was killed by signal {name} (exit code {code})"
    return f"exited with code {code}"


class Job:
    """Owns the driver's servers and workers from launch to the job's end.

    `run()` returns the launcher's exit code: 0 when every worker exits 0; the first failing
    worker's code otherwise (the others are stopped: SIGTERM, then SIGKILL after the grace
    period); 128+N when the launcher itself received signal N. It raises `LaunchError` when
    the job cannot start. No worker outlives `run()`.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.job_id = uuid.uuid4().hex[:12]
        self._token = secrets.token_urlsafe(32)
        self._kv = MemoryKeyValueStore()
        self._rendezvous = Rendezvous(on_join=self._on_join)
        self._workers: dict[int, Worker] = {}
        self._stop_signal: int | None = None
        self._stopping = asyncio.Event()
        self._local = local_addresses()
        self._local_hosts = {
            h.hostname for h in settings.hosts if is_local(h.hostname, self._local)
        }
        self._local_launcher = LocalLauncher()
        self._ssh_launcher = SshLauncher(settings.ssh, settings.stop_grace)

    # --- inputs from the outside -----------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Called on SIGINT/SIGTERM: stop every worker and end the job with 128+signum."""
        if self._stop_signal is None:
            log.info("received %s: stopping all workers", signal.Signals(signum).name)
            self._stop_signal = signum
        self._stopping.set()

    def _on_join(self, slot: SlotInfo, epoch: int) -> None:
        worker = self._workers.get(slot.rank)
        if worker is not None and worker.state == "launching":
            worker.state = "joined"

    def status(self) -> JobStatus:
        return JobStatus(
            job_id=self.job_id,
            epoch=self._rendezvous.epoch,
            size=self.settings.np,
            hosts=[HostStatus(hostname=h.hostname, slots=h.slots) for h in self.settings.hosts],
            workers=[
                WorkerStatus(
                    rank=w.slot.rank,
                    hostname=w.slot.hostname,
                    local_rank=w.slot.local_rank,
                    state=w.state,
                    pid=w.process.pid if w.slot.hostname in self._local_hosts else None,
                    exit_code=w.exit_code,
                )
                for w in sorted(self._workers.values(), key=lambda w: w.slot.rank)
            ],
        )

    # --- the lifecycle ---------------------------------------------------------------------

    def _bind_address(self) -> str:
        if self.settings.network_interface:
            return interface_address(self.settings.network_interface)
        remote = [h.hostname for h in self.settings.hosts if h.hostname not in self._local_hosts]
        return route_source(remote[0]) if remote else "127.0.0.1"

    def _launcher(self, hostname: str) -> Launcher:
        return self._local_launcher if hostname in self._local_hosts else self._ssh_launcher

    def _worker_env(self, slot: SlotInfo, driver_url: str) -> dict[str, str]:
        values = {
            worker_env.HOSTNAME: slot.hostname,
            worker_env.RANK: slot.rank,
            worker_env.SIZE: slot.size,
            worker_env.LOCAL_RANK: slot.local_rank,
            worker_env.LOCAL_SIZE: slot.local_size,
            worker_env.CROSS_RANK: slot.cross_rank,
            worker_env.CROSS_SIZE: slot.cross_size,
            worker_env.DRIVER_URL: driver_url,
            worker_env.JOB_ID: self.job_id,
            worker_env.START_TIMEOUT: self.settings.start_timeout,
            worker_env.COLLECTIVE_TIMEOUT: self.settings.collective_timeout,
            worker_env.TOKEN: self._token,
            "PYTHONUNBUFFERED": "1",
        }
        return {**os.environ, **{k: str(v) for k, v in values.items()}}

    async def run(self) -> int:
        slots = assign_slots(self.settings.hosts, self.settings.np)
        server = HttpServer(
            create_app(Services(self._token, self._kv, self._rendezvous, self.status)),
            self._bind_address(),
        )
        await server.start()
        log.debug("job %s: HTTP API on %s", self.job_id, server.url)
        pumps: list[asyncio.Task[None]] = []
        try:
            await self._check_hosts({s.hostname for s in slots})
            self._rendezvous.form(1, slots)
            for slot in slots:
                await self._launch(slot, server.url, pumps)
            return await self._watch()
        finally:
            await self._stop_all()
            await asyncio.gather(*pumps, return_exceptions=True)
            await server.stop()

    async def _check_hosts(self, hostnames: set[str]) -> None:
        remote = sorted(hostnames - self._local_hosts)
        checks = [
            self._ssh_launcher.check_reachable(h, self.settings.start_timeout) for h in remote
        ]
        for result in await asyncio.gather(*checks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _launch(self, slot: SlotInfo, url: str, pumps: list[asyncio.Task[None]]) -> None:
        spec = WorkerSpec(
            slot=slot,
            command=self.settings.command,
            env=self._worker_env(slot, url),
            cwd=os.getcwd(),
        )
        process = await self._launcher(slot.hostname).launch(spec)
        self._workers[slot.rank] = Worker(slot, process)
        for stream, reader in (("stdout", process.stdout), ("stderr", process.stderr)):
            sink = OutputSink(slot.rank, stream, self.settings.output_dir)
            pumps.append(asyncio.create_task(pump(reader, sink)))

    def _not_joined(self) -> list[int]:
        """Ranks still running that have not joined the rendezvous yet."""
        return sorted(
            w.slot.rank
            for w in self._workers.values()
            if w.state == "launching" and w.exit_code is None
        )

    async def _watch(self) -> int:
        """Wait for the job's end; return the exit code (see the class docstring).

        Until every running worker has joined, the wait is bounded by the start timeout.
        """
        exits = {asyncio.create_task(w.process.wait()): w for w in self._workers.values()}
        stopping = asyncio.create_task(self._stopping.wait())
        loop = asyncio.get_running_loop()
        start_deadline = loop.time() + self.settings.start_timeout
        try:
            while exits:
                starting = bool(self._not_joined())
                timeout = max(0.0, start_deadline - loop.time()) if starting else None
                done, _ = await asyncio.wait(
                    [*exits, stopping], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    assert self._stop_signal is not None
                    return 128 + self._stop_signal
                if not done and (missing := self._not_joined()):
                    raise LaunchError(
                        f"rank(s) {missing} did not join the rendezvous within "
                        f"{self.settings.start_timeout:g} s (--start-timeout)"
                    )
                for task in done:
                    worker = exits.pop(task)
                    worker.exit_code = task.result()
                    if worker.exit_code != 0:
                        worker.state = "failed"
                        log.error(
                            "rank %d on host %s %s; stopping the other workers",
                            worker.slot.rank,
                            worker.slot.hostname,
                            describe_exit(worker),
                        )
                        return worker.exit_code
                    worker.state = "exited"
            return 0
        finally:
            for task in (*exits, stopping):
                task.cancel()

    async def _stop_all(self) -> None:
        """SIGTERM every running worker, SIGKILL those still running after the grace period."""
        running = [w for w in self._workers.values() if w.exit_code is None]
        if not running:
            return
        for worker in running:
            worker.process.terminate()
        waits = [asyncio.create_task(w.process.wait()) for w in running]
        _, late = await asyncio.wait(waits, timeout=self.settings.stop_grace)
        if late:
            for worker, task in zip(running, waits, strict=True):
                if task in late:
                    worker.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*late), timeout=self.settings.stop_grace)
        for worker, task in zip(running, waits, strict=True):
            if task.done() and not task.cancelled():
                worker.exit_code = task.result()
            worker.state = "stopped"
