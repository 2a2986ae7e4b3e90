"""The driver side of the simulated workers (`simulated_workers`): the real driver, its
launcher replaced, and the client processes it talks to.

`ClientProcess` starts and talks to one process of simulated workers (`python -m
bench.support.simulated_workers`); `Changes` waits on the event loop for what their reports
say; `FakeLauncher` stands in for the driver's launcher and hands each worker's environment
to a `send` function instead of starting a process; `make_job` builds the real `Job` around
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support.child_processes import child_env
from bench.support.paths import ROOT
from bench.support.simulated_workers import Command, Report


class ClientProcess:
    """A process of simulated workers, seen from the process that started it: `send` commands,
    every report goes to `on_report` (called on this event loop)."""

    def __init__(self, on_report: Report) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self._on_report = on_report
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.support.simulated_workers",
            cwd=ROOT,
            env=child_env(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self._on_report(json.loads(line))
        self._on_report({"ev": "client_exited", "pid": self.process.pid})

    def send(self, command: Command) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())

    async def close(self) -> None:
        """Ask the process to exit; SIGKILL it after 10 s."""
        if self.process is None:
            return
        with contextlib.suppress(Exception):
            self.send({"op": "exit"})
            assert self.process.stdin is not None
            await self.process.stdin.drain()
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await self._reader


class Changes:
    """Wait on the event loop until a predicate over reports holds; `notify()` on each."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def notify(self) -> None:
        self._changed.set()

    async def wait(
        self,
        predicate: Callable[[], bool],
        what: str,
        timeout: float,
        ended: Callable[[], str | None] = lambda: None,
        poll: float = 0.05,
    ) -> None:
        """Until `predicate()`; raises TimeoutError after `timeout` s, RuntimeError as soon
        as `ended()` says why waiting is pointless (the job ended, a process exited)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if (why := ended()) is not None:
                raise RuntimeError(f"waiting for {what}: {why}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waiting for {what}: not within {timeout:g} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # also polls: some changes report nothing
                await asyncio.wait_for(self._changed.wait(), min(remaining, poll))


def fake_process_class() -> type:
    from elastic.driver.launch.launcher import WorkerProcess

    class FakeProcess(WorkerProcess):
        """A worker that is a simulated client: `wait()` returns when `end()` is called (a
        death, or the driver's terminate/kill), and then its client is stopped."""

        def __init__(self, worker_id: str, pid: int, send: Callable[[Command], None]) -> None:
            self.worker_id = worker_id
            self._pid = pid
            self._send = send
            self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._signal: int | None = None
            self.stdout = asyncio.StreamReader()
            self.stdout.feed_eof()
            self.stderr = asyncio.StreamReader()
            self.stderr.feed_eof()

        @property
        def pid(self) -> int:
            return self._pid

        @property
        def signal(self) -> int | None:
            return self._signal

        async def wait(self) -> int:
            # Shielded: the driver cancels tasks awaiting wait(); that must not end the worker.
            return await asyncio.shield(self._exit)

        def end(self, code: int, sig: int | None = None, stop_client: bool = True) -> None:
            """The process exits with `code`; `stop_client`: its simulated worker is stopped
            (False when the client already died)."""
            if not self._exit.done():
                self._signal = sig
                self._exit.set_result(code)
                if stop_client:
                    self._send({"op": "stop", "id": self.worker_id})

        def terminate(self) -> None:
            self.end(128 + signal.SIGTERM, signal.SIGTERM)

        def kill(self) -> None:
            self.end(128 + signal.SIGKILL, signal.SIGKILL)

    return FakeProcess


class FakeLauncher:
    """Stands in for the driver's launchers: `launch(spec)` starts no process; it sends the
    worker's environment as a `start` command (with `t`, the launch time) to `send`. A
    detached spec (`log_dir`, local workers with etcd) gets its empty stdout/stderr files, as
    the keeper would create them. Every host is reachable."""

    def __init__(self, send: Callable[[Command], None], pid: int) -> None:
        from elastic.protocol import env

        self._env = env
        self._send = send
        self._pid = pid
        self._process_class = fake_process_class()
        self.processes: dict[str, Any] = {}
        self.first_launch: float | None = None

    async def launch(self, spec: Any) -> Any:
        # A real launch awaits a process spawn (or an ssh session), which lets the event loop
        # run between launches; without this, the driver launched 10,000 workers in one step
        # of its loop, ~10 s in which it served none of the workers already started.
        await asyncio.sleep(0)
        now = time.monotonic()
        if self.first_launch is None:
            self.first_launch = now
        env = spec.env
        if spec.log_dir is not None:
            os.makedirs(spec.log_dir, exist_ok=True)
            for stream in ("stdout", "stderr"):
                Path(spec.log_dir, stream).touch()
        worker_id = env[self._env.WORKER_ID]
        self._send(
            {
                "op": "start",
                "worker_id": worker_id,
                "driver_url": env[self._env.DRIVER_URL],
                "control_address": env[self._env.CONTROL_ADDRESS],
                "token": env[self._env.TOKEN],
                "first_round": self._env.RANK in env,
                "t": now,
            }
        )
        process = self._process_class(worker_id, self._pid, self._send)
        self.processes[worker_id] = process
        return process

    async def check_reachable(self, hostname: str, timeout: float) -> None:
        return None


def make_job(
    backend_name: str,
    hosts: list[Any],
    launcher: FakeLauncher,
    *,
    etcd_endpoint: str | None = None,
    heartbeat: float = 1.0,
    start_timeout: float = 120.0,
    detached: bool = True,
    cooldown: tuple[float, float] | None = None,
    failure_scope: str = "worker",
) -> Any:
    """The real driver (`Job`) of an elastic job on `hosts` (`HostSpec`s) with every slot
    filled (`-np N --min-np 1 --max-np N`), state in `backend_name` (memory or etcd), every
    worker launched by `launcher` (local and remote hosts alike).

    `detached`: with etcd, local workers are detached and their output followed from files;
    remote ones (any name that is no address of this machine) always send it through pipes.
    `cooldown`: the failed hosts' cooldown range in seconds (default elasticrun's).
    `failure_scope`: --failure-scope; "worker" by default, as the benchmarks kill single
    workers among their host-mates and measure that."""
    import uuid

    from elastic.driver.job import Job
    from elastic.driver.journal.etcd import EtcdBackend
    from elastic.driver.journal.memory import MemoryBackend
    from elastic.driver.launch.host_access import HostAccess
    from elastic.driver.settings import BackendSettings, ElasticSettings, FailureScope, Settings
    from elastic.protocol.etcd import EtcdOptions, parse_endpoints

    job_id = f"bench-{uuid.uuid4().hex[:10]}"
    if backend_name == "memory":
        backend_settings = BackendSettings(job_id=job_id)
        backend: Any = MemoryBackend()
    elif backend_name == "etcd":
        assert etcd_endpoint is not None
        options = EtcdOptions(parse_endpoints(etcd_endpoint))
        backend_settings = BackendSettings(etcd=options, job_id=job_id)
        backend = EtcdBackend(options)
    else:
        raise ValueError(f"unknown backend {backend_name!r}")
    n = sum(h.slots for h in hosts)
    elastic = ElasticSettings(
        min_np=1,
        max_np=n,
        discovery_script=None,
        failure_scope=FailureScope(failure_scope),
        **({"cooldown_range": cooldown} if cooldown is not None else {}),
    )
    settings = Settings(
        np=n,
        hosts=hosts,
        command=["python", "train.py"],  # never run: the launcher is fake
        start_timeout=start_timeout,
        heartbeat_interval=heartbeat,
        elastic=elastic,
        backend=backend_settings,
    )
    access = HostAccess(
        settings.ssh,
        settings.stop_grace,
        settings.start_timeout,
        detached=detached and settings.backend.durable,
        local_launcher=launcher,
        ssh_launcher=launcher,
    )
    return Job(settings, backend=backend, hosts=access)
