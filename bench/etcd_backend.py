"""What the etcd backend costs the driver in steady state: epoch formation, etcd against memory.

    python -m bench.etcd_backend --trials 5 --large-trials 3

The real driver (`elastic.driver.job.Job`: rendezvous, HTTP API, gRPC control service, state
saver, liveness checks) runs in this process, once with `MemoryBackend` and once with
`EtcdBackend` on a real etcd server (`tests/etcd_server.py`, loopback, a fresh `--job-id` per
trial), the two interleaved per trial (alternating which goes first). Only the launcher is
replaced: `FakeLauncher` starts no process but hands each worker's environment to a separate
client process (`--clients`, asyncio: grpc.aio + httpx) where a simulated worker does what
`elastic.worker.runtime.init` and the elastic run loop do on the wire: gRPC Register (job token
as `authorization: Bearer ...`), the Events stream (opened before joining), a Heartbeat every
heartbeat interval, and `POST /v1/rendezvous/join` until `formed`; on `EpochBroken` /
`HostsUpdated` it joins again with `after_epoch` = its epoch. No torch, no process group.

Each trial of an elastic job `-np N --min-np 1 --max-np N -H localhost:N` (N = 2, 4, 8 and
1000 simulated workers) measures, in seconds:

* `first_epoch_s`: the driver's first `launch()` call to the last worker receiving its slot
  in epoch 1 (`formed`, stamped with CLOCK_MONOTONIC in the client process);
* `run_to_first_epoch_s`: the same from `Job.run()` (adds the backend claim, the servers'
  start and, with etcd, publishing the job);
* `reform_s`: one worker "dies" (its `wait()` returns exit code 1 and its simulated client
  stops) to the last survivor receiving its slot in epoch 2 (max_np = N and the default
  cooldown of the dead worker's host: no refill launches);
* `idle_cpu_pct`: the driver process' CPU time (all threads) over 2 s of steady state
  (heartbeats only) between the two, as a percentage of one core.

With etcd, workers on the driver's host are detached: the driver follows each one's
stdout/stderr files (`elastic.driver.launch.output.follow` polls each), as it would for real local
workers; `FakeLauncher` creates those files empty, as the keeper would. The variant
`etcd_pipes` (1000 clients only) takes the detached output following out: the workers' host
is treated as remote, whose output comes through pipes (ssh), so it shows the cost of the
backend itself.

The JSON document goes to stdout and bench/results/etcd_backend.json; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if __package__ in (None, ""):  # run as a file: make `bench`, `elastic` and `tests` importable
    sys.path.insert(0, str(ROOT))

from bench.machine_load import OtherLoad  # noqa: E402 - after the path fix above

SMALL_SIZES = (2, 4, 8)
LARGE_SIZE = 1000
SMALL_HEARTBEAT_S = 1.0  # elasticrun's default
# 1000 simulated workers share one CPU with their client process: at 1 s heartbeats they
# miss their deadlines during the formation storm (with either backend), each one declared
# dead re-forms the epoch for all, and the job collapses; at 3 s it still does in about half
# the re-forms. 5 s (declared dead after 15 s) keeps every worker alive.
LARGE_HEARTBEAT_S = 5.0
IDLE_WINDOW_S = 2.0
FORM_TIMEOUT_S = 120.0
# etcd with 1000 local (detached) workers: the driver may be too busy following their 2000
# output files to form or re-form the epoch; its trials stop waiting after this long.
DETACHED_LARGE_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 10.0
METRICS = ("first_epoch_s", "run_to_first_epoch_s", "reform_s", "idle_cpu_pct")


# --- the client process: simulated workers ---------------------------------------------------


class SimWorker:
    """One simulated worker: register, open the event stream, heartbeat, join epochs."""

    def __init__(self, spec: dict[str, Any], tls: Any, report: Any) -> None:
        import httpx

        self.spec = spec
        self.worker_id: str = spec["worker_id"]
        # Its own client and connection, as a worker process has (httpx's pool scans every
        # connection it holds for each request: one pool of 1000 would cost O(N) a request).
        self._http = httpx.AsyncClient(verify=tls)
        self._report = report
        self._auth = f"Bearer {spec['token']}"
        self.epoch = 0
        self._broken = 0  # newest EpochBroken epoch seen
        self._update = 0  # newest HostsUpdated next_epoch seen
        self._wake = asyncio.Event()
        self._channel: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.main: asyncio.Task[None] | None = None

    async def run(self) -> None:
        from grpc import aio

        from elastic.protocol import control_pb2 as pb
        from elastic.protocol import control_pb2_grpc as pb_grpc

        metadata = (("authorization", self._auth),)
        # Each worker is its own process in reality: its own connection, no shared subchannel.
        self._channel = aio.insecure_channel(
            self.spec["control_address"], options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = pb_grpc.ControlStub(self._channel)
        answer = await stub.Register(
            pb.RegisterRequest(worker_id=self.worker_id, pid=os.getpid()),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        interval = answer.heartbeat_interval or 1.0
        self._tasks.append(asyncio.create_task(self._heartbeats(stub, pb, metadata, interval)))
        call = stub.Events(pb.EventsRequest(worker_id=self.worker_id), metadata=metadata)
        await call.initial_metadata()  # the driver accepted the stream: no event is missed
        self._tasks.append(asyncio.create_task(self._events(call)))
        while True:
            if not await self._join():
                return
            while not (self._broken >= self.epoch or self._update > self.epoch):
                self._wake.clear()
                await self._wake.wait()

    async def _join(self) -> bool:
        """Join the first epoch after `self.epoch`; False when told to leave the job."""
        url = self.spec["driver_url"] + "/v1/rendezvous/join"
        while True:
            body = {
                "worker_id": self.worker_id,
                "after_epoch": self.epoch,
                "pid": os.getpid(),
                "timeout": 30.0,
            }
            answer = await self._http.post(
                url, json=body, headers={"Authorization": self._auth}, timeout=45.0
            )
            answer.raise_for_status()
            data = answer.json()
            if data["status"] == "formed":
                self.epoch = data["epoch"]
                self._report(
                    {"ev": "formed", "id": self.worker_id, "epoch": self.epoch,
                     "t": time.monotonic()}
                )  # fmt: skip
                return True
            if data["status"] == "not_member":
                return False

    async def _heartbeats(self, stub: Any, pb: Any, metadata: Any, interval: float) -> None:
        import grpc

        while True:
            try:
                await stub.Heartbeat(
                    pb.HeartbeatRequest(worker_id=self.worker_id, epoch=self.epoch),
                    metadata=metadata,
                    timeout=max(1.0, interval),
                )
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:  # declared dead
                    return
            await asyncio.sleep(interval)

    async def _events(self, call: Any) -> None:
        async for event in call:
            kind = event.WhichOneof("kind")
            if kind == "epoch_broken":
                self._broken = max(self._broken, event.epoch_broken.epoch)
            elif kind == "hosts_updated":
                self._update = max(self._update, event.hosts_updated.next_epoch)
            self._wake.set()

    async def stop(self) -> None:
        for task in [*self._tasks, *([self.main] if self.main else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close(grace=None)
        await self._http.aclose()


async def serve_clients() -> None:
    """The client process: commands on stdin, one JSON object a line; reports on stdout."""
    import ssl

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout

    def report(doc: dict[str, Any]) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    # Plain HTTP: the context is never used, but one shared object spares each client
    # loading the CA bundle.
    tls = ssl.create_default_context()
    sims: dict[str, SimWorker] = {}

    def finished(sim: SimWorker, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            report({"ev": "error", "id": sim.worker_id, "error": repr(error)})

    while line := await reader.readline():
        command = json.loads(line)
        op = command["op"]
        if op == "start":
            sim = SimWorker(command, tls, report)
            sims[sim.worker_id] = sim
            sim.main = asyncio.create_task(sim.run())
            sim.main.add_done_callback(lambda task, sim=sim: finished(sim, task))
        elif op == "stop":
            if (sim := sims.pop(command["id"], None)) is not None:
                await sim.stop()
            report({"ev": "stopped", "id": command["id"]})
        elif op == "stop_all":
            doomed, sims = list(sims.values()), {}
            await asyncio.gather(*(s.stop() for s in doomed), return_exceptions=True)
            report({"ev": "stopped_all", "n": len(doomed)})
        elif op == "exit":
            break


# --- the driver side -------------------------------------------------------------------------


class Clients:
    """The client process, as seen from the driver's event loop: send commands, collect when
    each simulated worker received its slot in which epoch."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.formed: dict[str, tuple[int, float]] = {}  # worker id -> (epoch, monotonic t)
        self.errors: list[str] = []
        self.stopped_all = 0
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.etcd_backend",
            "--clients",
            cwd=ROOT,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            doc = json.loads(line)
            if doc["ev"] == "formed":
                self.formed[doc["id"]] = (doc["epoch"], doc["t"])
            elif doc["ev"] == "stopped_all":
                self.stopped_all += 1
            elif doc["ev"] == "error":
                self.errors.append(f"{doc['id']}: {doc['error']}")
            self._changed.set()
        self._changed.set()

    def send(self, command: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())

    async def wait(
        self, predicate: Any, what: str, timeout: float, ended: Any = lambda: None
    ) -> None:
        """Until `predicate()`; raises TimeoutError after `timeout` s, RuntimeError when the
        client process exits or `ended()` says why the job ended."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.process is not None and self.process.returncode is not None:
                raise RuntimeError(f"waiting for {what}: the client process exited")
            if (why := ended()) is not None:
                raise RuntimeError(f"waiting for {what}: {why}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waiting for {what}: nothing within {timeout:g} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # also polls: launches report nothing
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))

    async def formed_at(
        self, ids: list[str], epoch: int, timeout: float, ended: Any = lambda: None
    ) -> float:
        """The time the last of `ids` received a slot in `epoch` or later."""

        def done() -> bool:
            return all(self.formed.get(i, (0, 0.0))[0] >= epoch for i in ids)

        await self.wait(done, f"{len(ids)} worker(s) in epoch {epoch}", timeout, ended)
        return max(self.formed[i][1] for i in ids)

    async def stop_all(self) -> None:
        """Stop every simulated worker left and wait until the client process did."""
        before = self.stopped_all
        self.send({"op": "stop_all"})
        await self.wait(lambda: self.stopped_all > before, "stop_all", 60)
        self.formed.clear()

    async def close(self) -> None:
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


def fake_process_class() -> type:
    from elastic.driver.launch.base import WorkerProcess

    class FakeProcess(WorkerProcess):
        """A worker that is a simulated client: `wait()` returns when `end()` is called (a
        death, or the driver's terminate/kill), and then its client stops."""

        def __init__(self, worker_id: str, pid: int, clients: Clients) -> None:
            self.worker_id = worker_id
            self._pid = pid
            self._clients = clients
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

        def end(self, code: int, sig: int | None = None) -> None:
            if not self._exit.done():
                self._signal = sig
                self._exit.set_result(code)
                self._clients.send({"op": "stop", "id": self.worker_id})

        def terminate(self) -> None:
            self.end(128 + signal.SIGTERM, signal.SIGTERM)

        def kill(self) -> None:
            self.end(128 + signal.SIGKILL, signal.SIGKILL)

    return FakeProcess


class FakeLauncher:
    """Stands in for the driver's launcher: `launch(spec)` starts no process; it hands the
    worker's environment to the client process. A detached spec (`log_dir`, etcd backend)
    gets its empty stdout/stderr files, as the keeper would create them."""

    def __init__(self, clients: Clients) -> None:
        from elastic.protocol import env

        self._env = env
        self._clients = clients
        self._process_class = fake_process_class()
        self.processes: dict[str, Any] = {}
        self.first_launch: float | None = None

    async def launch(self, spec: Any) -> Any:
        if self.first_launch is None:
            self.first_launch = time.monotonic()
        env = spec.env
        if spec.log_dir is not None:
            os.makedirs(spec.log_dir, exist_ok=True)
            for stream in ("stdout", "stderr"):
                Path(spec.log_dir, stream).touch()
        worker_id = env[self._env.WORKER_ID]
        self._clients.send(
            {
                "op": "start",
                "worker_id": worker_id,
                "driver_url": env[self._env.DRIVER_URL],
                "control_address": env[self._env.CONTROL_ADDRESS],
                "token": env[self._env.TOKEN],
            }
        )
        assert self._clients.process is not None
        process = self._process_class(worker_id, self._clients.process.pid, self._clients)
        self.processes[worker_id] = process
        return process

    async def check_reachable(self, hostname: str, timeout: float) -> None:
        return None


def make_job(
    variant: str, n: int, etcd_endpoint: str | None, clients: Clients, heartbeat: float = 1.0
) -> tuple:
    """A Job with the real driver for `variant` (memory, etcd, etcd_pipes) and its launcher."""
    from elastic.driver.discovery.hosts import HostSpec
    from elastic.driver.job import Job
    from elastic.driver.journal.etcd import EtcdBackend
    from elastic.driver.journal.memory import MemoryBackend
    from elastic.driver.launch.host_access import HostAccess
    from elastic.driver.settings import BackendSettings, ElasticSettings, Settings
    from elastic.protocol.etcd import EtcdOptions, parse_endpoints

    job_id = f"bench-{uuid.uuid4().hex[:10]}"
    if variant == "memory":
        backend_settings = BackendSettings(job_id=job_id)
        backend: Any = MemoryBackend()
    else:
        assert etcd_endpoint is not None
        options = EtcdOptions(parse_endpoints(etcd_endpoint))
        backend_settings = BackendSettings(etcd=options, job_id=job_id)
        backend = EtcdBackend(options)
    settings = Settings(
        np=n,
        hosts=[HostSpec("localhost", n)],
        command=["python", "train.py"],  # never run: the launcher is fake
        start_timeout=FORM_TIMEOUT_S,
        heartbeat_interval=heartbeat,
        elastic=ElasticSettings(min_np=1, max_np=n, discovery_script=None),
        backend=backend_settings,
    )
    launcher = FakeLauncher(clients)
    # etcd_pipes: the workers' output through pipes, as for a remote host, not followed files.
    hosts = HostAccess(
        settings.ssh,
        settings.stop_grace,
        settings.start_timeout,
        detached=variant != "etcd_pipes" and settings.backend.durable,
        local_launcher=launcher,
    )
    job = Job(settings, backend=backend, hosts=hosts)
    return job, launcher


async def run_trial(
    variant: str,
    n: int,
    etcd_endpoint: str | None,
    clients: Clients,
    heartbeat: float,
    form_timeout: float = FORM_TIMEOUT_S,
) -> dict[str, Any]:
    """One job: launch `n` simulated workers, time epoch 1, 2 s of steady state, one death
    and epoch 2; then stop the job (SIGTERM) and every simulated worker."""
    record: dict[str, Any] = {"variant": variant, "n": n, "heartbeat_s": heartbeat, "ok": False}
    job, launcher = make_job(variant, n, etcd_endpoint, clients, heartbeat)
    record["job_id"] = job.job_id
    started = time.monotonic()
    run = asyncio.create_task(job.run())

    def ended() -> str | None:
        if not run.done():
            return None
        code = run.exception() or run.result()
        return f"the job ended ({code}): {job._end_message}"

    try:
        ids: list[str] = []

        def all_launched() -> bool:
            ids[:] = list(launcher.processes)
            return len(ids) == n

        await clients.wait(all_launched, f"{n} launches", form_timeout, ended)
        formed = await clients.formed_at(ids, 1, form_timeout, ended)
        assert launcher.first_launch is not None
        record["first_epoch_s"] = round(formed - launcher.first_launch, 4)
        record["run_to_first_epoch_s"] = round(formed - started, 4)

        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(IDLE_WINDOW_S)
        record["idle_cpu_pct"] = round(
            100 * (time.process_time() - cpu0) / (time.monotonic() - wall0), 1
        )

        victim = ids[-1]
        survivors = ids[:-1]
        killed = time.monotonic()
        launcher.processes[victim].end(1)
        reformed = await clients.formed_at(survivors, 2, form_timeout, ended)
        record["reform_s"] = round(reformed - killed, 4)
        record["launches"] = len(launcher.processes)
        record["epochs_seen"] = sorted({e for e, _ in clients.formed.values()})
        record["ok"] = True
    except Exception as err:
        record["error"] = f"{type(err).__name__}: {err}"
        record["formed_epoch_1"] = sum(1 for e, _ in clients.formed.values() if e >= 1)
        record["launches"] = len(launcher.processes)
        record["workers_failed"] = sum(w.state.value == "failed" for w in job._workers.values())
        record["epoch_reached"] = job._rendezvous.epoch
    finally:
        job.request_stop(signal.SIGTERM)
        try:
            record["exit_code"] = await asyncio.wait_for(run, 60)
        except Exception as err:
            record.setdefault("error", f"stopping: {type(err).__name__}: {err}")
            record["ok"] = False
        await clients.stop_all()
        if clients.errors:
            record["client_errors"] = clients.errors[:5]
            record["client_error_count"] = len(clients.errors)
            clients.errors.clear()
    return record


def summarize(values: list[float]) -> dict[str, float | int]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--short").splitlines()}


def markdown(results: list[dict[str, Any]]) -> str:
    """Medians [min–max] per workers and metric; ratios of medians to memory's."""
    rows = [
        "| workers | metric | memory | etcd | etcd / memory | etcd_pipes | etcd_pipes / memory |",
        "|---:|---|---|---|---:|---|---:|",
    ]

    def cell(entry: dict[str, Any], variant: str, key: str) -> str:
        summary = entry["variants"].get(variant)
        if summary is None:
            return "—"
        if key in summary:
            m = summary[key]
            return f"{m['median']:g} [{m['min']:g}–{m['max']:g}]"
        return "failed" if summary.get("failures") else "—"

    def ratio(entry: dict[str, Any], variant: str, key: str) -> str:
        value = entry["ratio_vs_memory"].get(variant, {}).get(key)
        return "—" if value is None else f"{value:.2f}"

    for entry in results:
        for key in [*METRICS, "trials ok"]:
            if key == "trials ok":
                oks = {v: f"{e['trials_ok']}/{e['trials']}" for v, e in entry["variants"].items()}
                mem, etcd, pipes = (oks.get(v, "—") for v in ("memory", "etcd", "etcd_pipes"))
                rows.append(f"| {entry['n']} | trials ok | {mem} | {etcd} | | {pipes} | |")
                continue
            rows.append(
                f"| {entry['n']} | {key} | {cell(entry, 'memory', key)} | "
                f"{cell(entry, 'etcd', key)} | {ratio(entry, 'etcd', key)} | "
                f"{cell(entry, 'etcd_pipes', key)} | {ratio(entry, 'etcd_pipes', key)} |"
            )
    return "\n".join(rows)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from tests.etcd_server import EtcdServer

    # (workers, {variant: trials}, heartbeat s); variants interleaved per trial.
    plan: list[tuple[int, dict[str, int], float]] = [
        (n, {"memory": args.trials, "etcd": args.trials}, SMALL_HEARTBEAT_S) for n in args.sizes
    ]
    if args.large_trials > 0:
        large = {"memory": args.large_trials, "etcd_pipes": args.large_trials}
        if args.detached_trials > 0:
            large["etcd"] = args.detached_trials
        plan.append((LARGE_SIZE, large, args.large_heartbeat))
    records: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="etcd-backend-bench-") as tmp,
        OtherLoad(tmp) as load,
    ):
        os.environ["TMPDIR"] = tmp  # the detached workers' folders (elasticrun-<job id>/)
        etcd = EtcdServer(Path(tmp) / "etcd")
        etcd.start()
        clients = Clients()
        try:
            await clients.start()
            assert clients.process is not None
            load.own.add(clients.process.pid)
            for variant in ("memory", "etcd"):  # untimed: imports, first connections
                warmup = await run_trial(variant, 2, etcd.endpoint, clients, SMALL_HEARTBEAT_S)
                if not warmup["ok"]:
                    raise RuntimeError(f"warm-up trial {variant} failed: {warmup.get('error')}")
            for n, counts, heartbeat in plan:
                variants = list(counts)
                for trial in range(max(counts.values())):
                    order = variants[trial % len(variants) :] + variants[: trial % len(variants)]
                    for variant in order:
                        if trial >= counts[variant]:
                            continue
                        limit = FORM_TIMEOUT_S
                        if variant == "etcd" and n == LARGE_SIZE:
                            limit = DETACHED_LARGE_TIMEOUT_S
                        t0, mark = time.monotonic(), load.mark()
                        record = await run_trial(
                            variant, n, etcd.endpoint, clients, heartbeat, limit
                        )
                        record["other_processes_cpu_pct"] = load.mean_since(mark)
                        record["trial"] = trial
                        record["wall_s"] = round(time.monotonic() - t0, 2)
                        records.append(record)
                        shown = ", ".join(f"{k} {record[k]}" for k in METRICS if k in record)
                        status = "ok" if record["ok"] else f"FAILED ({record.get('error')})"
                        other = record["other_processes_cpu_pct"]
                        print(
                            f"n {n} {variant} trial {trial}: {status}; {shown}; "
                            f"other processes {other} % CPU",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            await clients.close()
            etcd.stop()
    results = []
    for n, counts, heartbeat in plan:
        variants = list(counts)
        entry: dict[str, Any] = {
            "n": n,
            "heartbeat_s": heartbeat,
            "variants": {},
            "ratio_vs_memory": {},
        }
        for variant in variants:
            mine = [r for r in records if r["n"] == n and r["variant"] == variant]
            summary: dict[str, Any] = {
                "trials": len(mine),
                "trials_ok": sum(r["ok"] for r in mine),
            }
            for key in METRICS:
                values = [r[key] for r in mine if r.get(key) is not None]
                if values:
                    summary[key] = summarize(values)
            failed = [r for r in mine if not r["ok"]]
            if failed:
                summary["failures"] = [
                    f"trial {r['trial']}: {r.get('error')} ({r.get('formed_epoch_1', '?')} of "
                    f"{n} workers had a slot in epoch 1; {r.get('launches', '?')} launched, "
                    f"{r.get('workers_failed', '?')} declared dead or failed, epoch "
                    f"{r.get('epoch_reached', '?')} reached)"
                    for r in failed
                ]
            entry["variants"][variant] = summary
        memory = entry["variants"]["memory"]
        for variant in [v for v in variants if v != "memory"]:
            entry["ratio_vs_memory"][variant] = {
                key: round(entry["variants"][variant][key]["median"] / memory[key]["median"], 2)
                for key in METRICS
                if key in entry["variants"][variant] and memory.get(key, {}).get("median")
            }
        results.append(entry)
    return {"records": records, "results": results, "machine": load.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per backend, 2-8 workers")
    parser.add_argument(
        "--large-trials", type=int, default=3, help="trials per variant with 1000 workers (0: skip)"
    )
    parser.add_argument(
        "--detached-trials",
        type=int,
        default=1,
        help="trials of etcd with 1000 local (detached) workers, which do not form within "
        f"{DETACHED_LARGE_TIMEOUT_S:g} s on 2 CPUs (0: skip)",
    )
    parser.add_argument(
        "--large-heartbeat",
        type=float,
        default=LARGE_HEARTBEAT_S,
        help="heartbeat interval (s) of the 1000-worker jobs",
    )
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SMALL_SIZES)
    )
    parser.add_argument("--clients", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clients:
        asyncio.run(serve_clients())
        return
    logging.basicConfig(format="elasticrun: %(message)s", level=logging.WARNING)
    # Warnings and errors of each trial (the simulated death, the cooldown) are expected noise.
    logging.getLogger("elasticrun").setLevel(logging.CRITICAL)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    start = time.monotonic()
    load_before = os.getloadavg()
    code = git_state()
    outcome = asyncio.run(bench(args))
    import grpc
    import pyetcd  # noqa: F401 - its presence is what the etcd backend needs

    doc: dict[str, Any] = {
        "benchmark": "etcd_backend",
        "command": " ".join(["python -m bench.etcd_backend", *sys.argv[1:]]),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "etcd": subprocess.run(
            ["etcd", "--version"], capture_output=True, text=True
        ).stdout.splitlines()[:1],
        "git": code,
        "job": {
            "flags": "-np N --min-np 1 --max-np N -H localhost:N (elastic, fixed hosts)",
            "heartbeat_interval_s": {
                "2-8 workers": SMALL_HEARTBEAT_S,
                f"{LARGE_SIZE} workers": args.large_heartbeat,
            },
            "idle_window_s": IDLE_WINDOW_S,
        },
        "notes": [
            "one driver (this process, one event loop) and one client process with every "
            "simulated worker (asyncio), on a 2-CPU machine; etcd is a third process",
            "first_epoch_s / reform_s end when the last worker receives `formed` (client-side "
            "CLOCK_MONOTONIC, comparable across processes)",
            "etcd: a formed join is answered only after the state is saved in etcd "
            "(Services.durable -> StateSaver.flush)",
            "etcd: local workers are detached, the driver polls their 2 output files each; "
            "etcd_pipes treats the host as remote (output through pipes) to show the "
            "backend's own cost",
            f"{LARGE_SIZE} workers, etcd with detached local workers: the driver's event loop "
            f"also follows 2000 output files; its trials give up after "
            f"{DETACHED_LARGE_TIMEOUT_S:g} s per wait",
            f"{LARGE_SIZE} workers at 1 s heartbeats (--large-heartbeat 1) collapse with either "
            "backend on this machine: heartbeats are late during the join storm, each worker "
            "declared dead re-forms the epoch for all, until every worker failed",
        ],
        "results": outcome["results"],
        "machine_load": outcome["machine"],
        "trials": outcome["records"],
        "wall_s": round(time.monotonic() - start, 1),
        "loadavg_1_5_15min": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    doc["table"] = markdown(outcome["results"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2)
    (RESULTS / "etcd_backend.json").write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
