"""The real driver in a process of its own, its launcher handing every worker to simulated
workers, and a benchmark's handle of it (`DriverProcess`).

    python -m bench.support.driver_process WORKERS BACKEND HEARTBEAT SLOTS_PER_HOST ETCD

runs one elastic job (`-np N --min-np 1 --max-np N`, `make_job`) of WORKERS workers on hosts
of SLOTS_PER_HOST slots that the driver treats as remote. Its stdout carries the protocol, one
JSON object a line: the launcher's commands (`op`: start a worker, stop one) and the job's
events (`ev`: `run`, `status`, `ended`); stdin takes the benchmark's (`exit`: those workers'
processes exit; `status`; `stop`: SIGTERM the job). Its own output and log go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import math
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from bench.support.child_processes import child_env, raise_open_files_limit
from bench.support.machine_load import process_cpu_seconds
from bench.support.paths import ROOT
from bench.support.simulated_fleet import Fleet
from bench.support.simulated_job import FakeLauncher, make_job

START_TIMEOUT_S = 300.0
COOLDOWN_S = 600.0


def host_layout(n: int, slots_per_host: int) -> list[Any]:
    """`HostSpec`s for N workers: hosts 127.1.x.y of `slots_per_host` slots (the last one
    may have fewer), or one `localhost:N` when `slots_per_host` is 0."""
    from elastic.driver.discovery.hosts import HostSpec

    if slots_per_host <= 0:
        return [HostSpec("localhost", n)]
    hosts = []
    for index in range(math.ceil(n / slots_per_host)):
        high, low = divmod(index, 254)
        slots = min(slots_per_host, n - index * slots_per_host)
        hosts.append(HostSpec(f"127.1.{high}.{low + 1}", slots))
    return hosts


async def serve_driver(args: argparse.Namespace, protocol: IO[str]) -> None:
    """Run one job; the launcher's commands and the answers go to `protocol` as JSON lines,
    the benchmark's commands come on stdin (`exit`, `status`, `stop`)."""

    flush_due = False

    def flush() -> None:
        nonlocal flush_due
        flush_due = False
        protocol.flush()

    def emit(doc: dict[str, Any]) -> None:
        """Write `doc`; flushed once per turn of the event loop (one write for a burst of
        launches, not one system call each)."""
        nonlocal flush_due
        protocol.write(json.dumps(doc) + "\n")
        if not flush_due:
            flush_due = True
            asyncio.get_running_loop().call_soon(flush)

    n, backend, heartbeat, etcd = args.workers, args.backend, args.heartbeat, args.etcd
    launcher = FakeLauncher(emit, os.getpid())
    job = make_job(
        backend,
        host_layout(n, args.slots_per_host),
        launcher,
        etcd_endpoint=None if etcd == "-" else etcd,
        heartbeat=heartbeat,
        start_timeout=START_TIMEOUT_S,
        detached=False,
        cooldown=(COOLDOWN_S, COOLDOWN_S),
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def commands() -> None:
        while line := await reader.readline():
            command = json.loads(line)
            if command["op"] == "exit":
                for worker_id in command["ids"]:
                    if (process := launcher.processes.get(worker_id)) is not None:
                        process.end(command["code"], command.get("signal"), stop_client=False)
            elif command["op"] == "status":
                status = job.status()
                states = Counter(w.state for w in status.workers)
                emit({"ev": "status", "epoch": status.epoch, "size": status.size, "states": states})
            elif command["op"] == "stop":
                job.request_stop(signal.SIGTERM)
        job.request_stop(signal.SIGTERM)  # the benchmark is gone

    listening = asyncio.create_task(commands())
    emit({"ev": "run", "t": time.monotonic()})
    code = await job.run()
    listening.cancel()
    emit({"ev": "ended", "code": code})
    protocol.flush()  # the loop ends with this coroutine: no later turn flushes it


def main(argv: list[str] | None = None) -> None:
    """The driver process: its stdout carries the protocol, everything else goes to stderr."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workers", type=int)
    parser.add_argument("backend", choices=("memory", "etcd"))
    parser.add_argument("heartbeat", type=float, help="the heartbeat interval, seconds")
    parser.add_argument("slots_per_host", type=int, help="0: one host, localhost")
    parser.add_argument("etcd", help="etcd's endpoint, or - for none")
    parser.add_argument("--profile", metavar="FILE", help="cProfile stats of the whole run")
    args = parser.parse_args(argv)
    raise_open_files_limit()
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # worker output and any print of the driver's go to the log, not the pipe
    logging.basicConfig(format="elasticrun: %(message)s", level=logging.WARNING)
    logging.getLogger("elasticrun").setLevel(logging.INFO)  # as `elasticrun` logs by default
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    try:
        asyncio.run(serve_driver(args, protocol))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)


class DriverProcess:
    """One trial's driver process (`main` above), seen from the benchmark."""

    def __init__(self, fleet: Fleet, log_path: Path) -> None:
        self._fleet = fleet
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self.run_at: float | None = None
        self.cpu_at_run = 0.0
        self.ended: dict[str, Any] | None = None
        self._statuses: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, argv: list[str]) -> None:
        """Start the driver process with `argv` (the arguments of `main`)."""
        with open(self.log_path, "wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.support.driver_process", *argv,
                cwd=ROOT, env=child_env(), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log, limit=1 << 24,
            )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            doc = json.loads(line)
            if "op" in doc:
                self._fleet.route(doc)
            elif doc["ev"] == "run":
                self.run_at = doc["t"]
                self.cpu_at_run = process_cpu_seconds(self.pid) or 0.0
            elif doc["ev"] == "status":
                self._statuses.put_nowait(doc)
            elif doc["ev"] == "ended":
                self.ended = doc
        self._fleet.changes.notify()

    def why_ended(self) -> str | None:
        if self.ended is not None:
            return f"the job ended (exit code {self.ended['code']})"
        if self.process is None or self.process.returncode is not None:
            return "the driver process exited"
        return None

    def send(self, command: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        if self.process.returncode is None:
            self.process.stdin.write((json.dumps(command) + "\n").encode())

    async def status(self, timeout: float = 60.0) -> dict[str, Any]:
        """The job's round, size and workers per state, as `Job.status()` says."""
        self.send({"op": "status"})
        try:
            return await asyncio.wait_for(self._statuses.get(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"the driver did not answer a status query in {timeout:g} s"
            ) from None

    async def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the job (as `elasticrun` gets it) and wait; SIGKILL after `timeout` s."""
        assert self.process is not None
        self.send({"op": "stop"})
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await self._reader
        return self.ended["code"] if self.ended is not None else None

    def log_tail(self, lines: int = 15) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def log_counts(self) -> dict[str, int]:
        """How often the driver's log says it formed a round or declared workers dead, by
        reason (the words of `elastic.driver.policy.liveness.Verdict`)."""
        from elastic.driver.policy.liveness import Verdict

        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return {}
        counts = {"rounds formed": sum(" epoch " in x and " worker(s) on " in x for x in lines)}
        for verdict in Verdict:
            counts[verdict.value] = sum(verdict.value in line for line in lines)
        counts["exited with code"] = sum("exited with code" in line for line in lines)
        return counts


if __name__ == "__main__":
    main()
