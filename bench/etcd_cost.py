"""What the etcd backend costs the driver in steady state: epoch formation, etcd against memory.

    python -m bench run etcd_cost --trials 5 --large-trials 3

The real driver (`elastic.driver.job.Job`: rendezvous, HTTP API, gRPC control service, state
saver, liveness checks) runs in this process, once with `MemoryBackend` and once with
`EtcdBackend` on a real etcd server (`tests/support/etcd_server.py`, loopback, a fresh `--job-id`
per trial), the two interleaved per trial (alternating which goes first). Only the launcher is
replaced: `FakeLauncher` starts no process but hands each worker's environment to a separate
client process (`bench.support.simulated_workers`, asyncio: grpc.aio and a minimal HTTP/1.1
client) where a simulated worker does what `elastic.worker.runtime.init` and the elastic run
loop do on the wire: gRPC Register (job token as `authorization: Bearer ...`), the Events stream
(opened before joining), a heartbeat every heartbeat interval on the port that stream names, and
`POST /v1/rendezvous/join` until `formed`; on `EpochBroken` / `HostsUpdated` it joins again with
`after_epoch` = its epoch. No torch, no process group. `bench/driver_scale.py` uses the same
workers, in several processes, against a driver in its own process, up to 10,000 workers.

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
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.support.child_processes import raise_open_files_limit
from bench.support.machine_load import OtherLoad
from bench.support.paths import RESULTS
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.simulated_job import Changes, ClientProcess, FakeLauncher, make_job

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


class Clients:
    """The client process (`bench.support.simulated_workers`), as seen from the driver's
    event loop: send commands, collect when each simulated worker received its slot in which
    epoch."""

    def __init__(self) -> None:
        self._client = ClientProcess(self._on_report)
        self.formed: dict[str, tuple[int, float]] = {}  # worker id -> (epoch, monotonic t)
        self.errors: list[str] = []
        self.stopped_all = 0
        self._changes = Changes()

    @property
    def pid(self) -> int:
        return self._client.pid

    async def start(self) -> None:
        await self._client.start()

    def _on_report(self, doc: dict[str, Any]) -> None:
        if doc["ev"] == "formed":
            self.formed[doc["id"]] = (doc["epoch"], doc["t"])
        elif doc["ev"] == "stopped_all":
            self.stopped_all += 1
        elif doc["ev"] in ("error", "evicted"):
            self.errors.append(f"{doc['id']}: {doc.get('error', 'declared dead')}")
        self._changes.notify()

    def send(self, command: dict[str, Any]) -> None:
        self._client.send(command)

    async def wait(
        self, predicate: Any, what: str, timeout: float, ended: Any = lambda: None
    ) -> None:
        """Until `predicate()`; raises TimeoutError after `timeout` s, RuntimeError when the
        client process exits or `ended()` says why the job ended."""

        def why() -> str | None:
            return ended() if self._client.running else "the client process exited"

        await self._changes.wait(predicate, what, timeout, why)

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
        await self._client.close()


def make_trial_job(
    variant: str, n: int, etcd_endpoint: str | None, clients: Clients, heartbeat: float = 1.0
) -> tuple[Any, FakeLauncher]:
    """A Job with the real driver for `variant` (memory, etcd, etcd_pipes) and its launcher."""
    from elastic.driver.discovery.hosts import HostSpec

    launcher = FakeLauncher(clients.send, clients.pid)
    job = make_job(
        "memory" if variant == "memory" else "etcd",
        [HostSpec("localhost", n)],
        launcher,
        etcd_endpoint=etcd_endpoint,
        heartbeat=heartbeat,
        start_timeout=FORM_TIMEOUT_S,
        # etcd_pipes: the workers' output through pipes, as for a remote host, not followed
        # files.
        detached=variant == "etcd",
    )
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
    job, launcher = make_trial_job(variant, n, etcd_endpoint, clients, heartbeat)
    record["job_id"] = job.job_id
    started = time.monotonic()
    run = asyncio.create_task(job.run())

    def ended() -> str | None:
        if not run.done():
            return None
        code = run.exception() or run.result()
        return f"the job ended ({code}): {job.end_message}"

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
        status = job.status()
        record["workers_failed"] = sum(w.state == "failed" for w in status.workers)
        record["epoch_reached"] = status.epoch
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
    from tests.support.etcd_server import EtcdServer

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
            load.own.add(clients.pid)
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


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
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
    args = parser.parse_args(argv)
    logging.basicConfig(format="elasticrun: %(message)s", level=logging.WARNING)
    # Warnings and errors of each trial (the simulated death, the cooldown) are expected noise.
    logging.getLogger("elasticrun").setLevel(logging.CRITICAL)
    raise_open_files_limit()
    start = time.monotonic()
    load_before = os.getloadavg()
    code = git_state()
    outcome = asyncio.run(bench(args))
    import grpc
    import pyetcd  # noqa: F401 - its presence is what the etcd backend needs

    doc: dict[str, Any] = {
        "benchmark": "etcd_backend",
        "command": command_line("etcd_cost", argv),
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
        "loadavg_1_5_15min": load_averages(load_before),
    }
    doc["table"] = markdown(outcome["results"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2)
    (RESULTS / "etcd_backend.json").write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
