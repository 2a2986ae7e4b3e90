"""Driver restart: SIGKILL the driver and a worker at once, start the driver again, measure the
next completed re-rendezvous; against the same worker death with the driver alive.

    python -m bench run driver_restart --trials 5

Real processes: `elasticrun -np 2 --min-np 1 -H localhost:2 --failure-scope worker
--blacklist-cooldown-range 300 300 python bench/workloads/tiny_elastic.py --commit-every 1
...` (a small MLP, `hvd.elastic.run`, a `TorchState` committed every step, one `step S size N
rank R pid P t T` line a step). Three variants, interleaved per trial (in a rotating order)
so that machine noise hits them alike:

* `etcd_restart`: `--backend etcd --etcd-endpoints ... --job-id <fresh>` on a real etcd
  (`tests/support/etcd_server.py`, loopback). Once it trains at size 2, SIGKILL the driver and the
  worker of rank 1 back to back, then start the driver again at once with the same command.
  Workers are detached (output in $TMPDIR/elasticrun-<job id>/worker.<n>/, tailed here while
  no driver runs); the new driver re-adopts the survivor, sees the death, forms epoch 2.
* `etcd_worker_kill`: the same job; SIGKILL only the worker of rank 1 (driver alive).
* `memory_worker_kill`: the same job with the default in-memory backend; SIGKILL only the
  worker of rank 1.

The cooldown of 300 s keeps the dead worker's slot empty, so the next epoch has size 1 in
every variant. Metrics (seconds):

* `recovery_s`: the kill(s) to the survivor's first completed step at size 1 (its own
  `time.time()` stamp): the next completed re-rendezvous;
* `restart_to_resuming_s` (etcd_restart): the new driver's start to its line `resuming job`;
* `steps_lost`: the last step printed before the kill minus the step training resumed from.

Milestones (from the kill, or from the restart for the driver's lines) show where the time
goes. Each trial ends with SIGKILL of every driver started (by PID) and of every process whose
command line names the trial's folder (keepers, workers). The JSON document goes to stdout and
bench/results/driver_restart.json, each trial's transcript to bench/results/driver_restart/;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.support.local_systems import ELASTIC_WORKLOAD
from bench.support.machine_load import OtherLoad
from bench.support.paths import RESULTS, ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.step_timing import summarize
from bench.support.trial_processes import Launcher, Output, Step, TrialFailed, processes_naming

VARIANTS = ["etcd_restart", "etcd_worker_kill", "memory_worker_kill"]
METRICS = ["recovery_s", "restart_to_resuming_s", "steps_lost"]
WORKER_MAX_SECONDS = 120.0  # the workers' safety timer: none outlives a killed benchmark
LAUNCH_TIMEOUT = 60.0
STEADY_STEPS = 10
RECOVERY_TIMEOUT = 60.0
TAIL_EVERY = 0.02  # seconds between looks at the detached workers' output files

# (label, pattern, stamp, from): "worker" lines carry their own time.time(); "arrival" lines
# (the drivers') are stamped when read here. "kill" / "restart": the moment measured from.
MILESTONES = [
    ("new driver: resuming job", r"elasticrun: resuming job", "arrival", "restart"),
    ("survivor: collective failed", r"elastic: rank \d+: .*failed", "worker", "kill"),
    ("survivor: driver unreachable", r"driver unreachable", "worker", "kill"),
    ("driver: saw the death", r"elasticrun: rank \d+ on host .*(signal|exit)", "arrival", "kill"),
    ("driver: round with 1 worker formed", r"elasticrun: round \d+: 1 worker", "arrival", "kill"),
    ("survivor: driver reachable again", r"reachable again", "worker", "kill"),
    ("survivor: entered the new epoch", r"event reset size 1", "worker", "kill"),
    ("survivor: first step at size 1", r"\bstep \d+ size 1 ", "worker", "kill"),
]


class FileTailer:
    """Feeds every line of the detached workers' files (`root`/worker.*/stdout, stderr) to
    `output` as they grow, whether a driver runs or not."""

    def __init__(self, root: Path, output: Output) -> None:
        self._root = root
        self._output = output
        self._offsets: dict[Path, int] = {}
        self._pending: dict[Path, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TAIL_EVERY):
            for path in sorted(self._root.glob("worker.*/std*")):
                offset = self._offsets.get(path, 0)
                try:
                    with open(path, "rb") as source:
                        source.seek(offset)
                        chunk = source.read()
                except OSError:
                    continue
                if not chunk:
                    continue
                self._offsets[path] = offset + len(chunk)
                *lines, rest = (self._pending.pop(path, b"") + chunk).split(b"\n")
                self._pending[path] = rest
                for raw in lines:
                    name = f"{path.parent.name}/{path.name}"
                    self._output.feed(name, raw.decode(errors="replace"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def elasticrun_cmd(variant: str, folder: Path, etcd: str, job_id: str) -> list[str]:
    exe = shutil.which("elasticrun")
    backend = (
        ["--backend", "etcd", "--etcd-endpoints", etcd, "--job-id", job_id]
        if variant.startswith("etcd")
        else []
    )
    return [
        *([exe] if exe else [sys.executable, "-m", "elastic.driver.cli"]),
        *backend,
        "-np", "2", "--min-np", "1", "-H", "localhost:2", "--failure-scope", "worker",
        "--blacklist-cooldown-range", "300", "300",
        sys.executable, str(ELASTIC_WORKLOAD),
        "--out", str(folder), "--commit-every", "1", "--max-seconds", str(WORKER_MAX_SECONDS),
    ]  # fmt: skip


def latest(out: Output, size: int, rank: int) -> Step | None:
    with out.cond:
        return next((s for s in reversed(out.steps) if s.size == size and s.rank == rank), None)


def milestones(out: Output, moments: dict[str, float]) -> dict[str, float | None]:
    """Seconds from each milestone's moment to the first line after it matching its pattern."""
    found: dict[str, float | None] = {}
    with out.cond:
        lines = list(out.lines)
    for label, pattern, stamp, since_name in MILESTONES:
        since = moments.get(since_name)
        if since is None:
            continue
        regex = re.compile(pattern)
        found[label] = next(
            (
                round(t - since, 3)
                for line in lines
                if (t := line.stamp if stamp == "worker" and line.stamp else line.arrived) >= since
                and regex.search(line.text)
            ),
            None,
        )
    return found


def stop_job(drivers: list[Launcher], marker: str) -> dict[str, Any]:
    """SIGKILL every driver started (by PID), then every process naming the trial's folder."""
    for driver in drivers:
        if driver.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(driver.process.pid, signal.SIGKILL)
        driver.process.wait(10)
    killed: list[str] = []
    deadline = time.monotonic() + 5.0
    while (left := processes_naming(marker)) and time.monotonic() < deadline:
        for pid, argv in left.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid}: {argv[:120]}")
        time.sleep(0.1)
    return {"processes_sigkilled": len(killed), "left": sorted(processes_naming(marker))}


def run_trial(variant: str, folder: Path, etcd: str) -> dict[str, Any]:
    """One job of `variant`: train at size 2, kill, measure the recovery, kill the job."""
    folder.mkdir(parents=True)
    job_id = f"restart-{uuid.uuid4().hex[:10]}"
    cmd = elasticrun_cmd(variant, folder, etcd, job_id)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(folder),  # detached workers write to $TMPDIR/elasticrun-<job id>/
    )
    record: dict[str, Any] = {"variant": variant, "ok": False, "job_id": job_id}
    record["command"] = f"TMPDIR={folder} OMP_NUM_THREADS=1 " + " ".join(cmd)
    out = Output()
    detached = variant.startswith("etcd")
    tailer = FileTailer(folder / f"elasticrun-{job_id}", out) if detached else None
    drivers = [Launcher("driver", cmd, env, out, ROOT)]
    live = list(drivers)
    t_launch = time.time()
    try:
        first = out.wait(
            "the first step at size 2",
            lambda o: next((s for s in o.steps if s.size == 2), None),
            LAUNCH_TIMEOUT,
            live,
        )
        record["launch_to_first_step_s"] = round(first.t - t_launch, 3)
        out.wait(
            "steady training at size 2",
            lambda o: (
                latest(o, 2, 1) is not None
                and max(s.step for s in o.steps) >= first.step + STEADY_STEPS
            ),
            LAUNCH_TIMEOUT,
            live,
        )
        victim, survivor = latest(out, 2, 1), latest(out, 2, 0)
        assert victim is not None and survivor is not None
        moments: dict[str, float] = {}
        with out.cond:
            last_step = max(s.step for s in out.steps)
            moments["kill"] = time.time()
            if variant == "etcd_restart":
                os.kill(drivers[0].process.pid, signal.SIGKILL)
            os.kill(victim.pid, signal.SIGKILL)
        if variant == "etcd_restart":
            moments["restart"] = time.time()
            drivers.append(Launcher("driver2", cmd, env, out, ROOT))
            live = drivers[1:]
            resumed = out.wait(
                "the new driver's 'resuming job' line",
                lambda o: next(
                    (x for x in o.lines if x.source == "driver2" and "resuming job" in x.text),
                    None,
                ),
                RECOVERY_TIMEOUT,
                live,
            )
            record["restart_to_resuming_s"] = round(resumed.arrived - moments["restart"], 3)
            record["resuming_line"] = resumed.text
        size1 = out.wait(
            "the survivor's first step at size 1",
            lambda o: next(
                (s for s in o.steps if s.size == 1 and s.t >= moments["kill"]),
                None,
            ),
            RECOVERY_TIMEOUT,
            live,
        )
        if size1.pid != survivor.pid:
            raise TrialFailed(f"the step at size 1 came from pid {size1.pid}, not the survivor")
        record["recovery_s"] = round(size1.t - moments["kill"], 3)
        record["steps_lost"] = last_step - (size1.step - 1)
        record["milestones"] = milestones(out, moments)
        record["ok"] = True
    except (TrialFailed, AssertionError) as err:
        record["error"] = str(err) or type(err).__name__
    finally:
        record["stop"] = stop_job(drivers, str(folder))
        if tailer is not None:
            tailer.stop()
        record["wall_s"] = round(time.time() - t_launch, 1)
        folder.with_suffix(".log").write_text(out.transcript(t_launch) + "\n")
    return record


def summarize_variant(records: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "trials": len(records),
        "trials_ok": sum(r["ok"] for r in records),
        "metrics": {},
        "milestones": {},
    }
    for key in METRICS:
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            summary["metrics"][key] = summarize(values)
    labels = [label for label, *_ in MILESTONES]
    for label in labels:
        values = [
            r["milestones"][label]
            for r in records
            if r.get("milestones", {}).get(label) is not None
        ]
        if values:
            summary["milestones"][label] = summarize(values)
    summary["failures"] = [f"trial {r['trial']}: {r['error']}" for r in records if "error" in r]
    return summary


def markdown(doc: dict[str, Any]) -> str:
    rows = ["| metric | " + " | ".join(VARIANTS) + " |", "|---" * (len(VARIANTS) + 1) + "|"]
    for key in METRICS:
        cells = []
        for name in VARIANTS:
            m = doc["variants"].get(name, {}).get("metrics", {}).get(key)
            cells.append(f"{m['median']:g} [{m['min']:g}–{m['max']:g}]" if m else "—")
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    oks = [
        f"{doc['variants'][v]['trials_ok']}/{doc['variants'][v]['trials']}"
        if v in doc["variants"]
        else "—"
        for v in VARIANTS
    ]
    rows.append("| trials ok | " + " | ".join(oks) + " |")
    ratios = doc["ratios"]
    rows.append(
        "\nrecovery_s ratio, median / median: etcd_restart / etcd_worker_kill "
        f"{ratios.get('etcd_restart_vs_etcd_worker_kill', '—')}; etcd_restart / "
        f"memory_worker_kill {ratios.get('etcd_restart_vs_memory_worker_kill', '—')}; "
        f"etcd_worker_kill / memory_worker_kill "
        f"{ratios.get('etcd_worker_kill_vs_memory_worker_kill', '—')}"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    from tests.support.etcd_server import EtcdServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    logs = RESULTS / "driver_restart"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    records: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    start = time.monotonic()
    load_before = os.getloadavg()
    code = git_state()
    with (
        tempfile.TemporaryDirectory(prefix="driver-restart-") as tmp,
        OtherLoad(tmp) as load,
    ):
        # A SIGTERM to the benchmark unwinds through the trials' cleanup like a Ctrl-C.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        etcd = EtcdServer(Path(tmp) / "etcd")
        etcd.start()
        try:
            for trial in range(args.trials):
                order = VARIANTS[trial % len(VARIANTS) :] + VARIANTS[: trial % len(VARIANTS)]
                for variant in order:
                    folder = Path(tmp) / f"t{trial}" / variant
                    mark = load.mark()
                    record = run_trial(variant, folder, etcd.endpoint)
                    record["other_processes_cpu_pct"] = load.mean_since(mark)
                    record["trial"] = trial
                    shutil.copy(folder.with_suffix(".log"), logs / f"{variant}-{trial}.log")
                    records[variant].append(record)
                    status = "ok" if record["ok"] else f"FAILED ({record['error']})"
                    shown = ", ".join(f"{k} {record[k]}" for k in METRICS if k in record)
                    print(
                        f"trial {trial} {variant}: {status} in {record['wall_s']} s; {shown}; "
                        f"other processes {record['other_processes_cpu_pct']} % CPU",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            etcd.stop()
            # Nothing of the benchmark may outlive it: look once more, SIGKILL what is left.
            leftovers = processes_naming(tmp)
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    import torch

    variants = {v: summarize_variant(records[v]) for v in VARIANTS}

    def median(name: str) -> float | None:
        m = variants[name]["metrics"].get("recovery_s")
        return m["median"] if m else None

    ratios = {}
    for a, b in [
        ("etcd_restart", "etcd_worker_kill"),
        ("etcd_restart", "memory_worker_kill"),
        ("etcd_worker_kill", "memory_worker_kill"),
    ]:
        if median(a) and median(b):
            ratios[f"{a}_vs_{b}"] = round(median(a) / median(b), 2)
    doc: dict[str, Any] = {
        "benchmark": "driver_restart",
        "command": command_line("driver_restart", argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "workload": {
            "script": str(ELASTIC_WORKLOAD.relative_to(ROOT)),
            "model": "MLP 64-768-768-768-1, SGD, 80 samples per rank and step, 1 thread",
            "commit_every_steps": 1,
            "job": "-np 2 --min-np 1 -H localhost:2 --blacklist-cooldown-range 300 300",
        },
        "notes": [
            "recovery_s: the kill(s) to the survivor's first completed step at size 1 (the "
            "worker's own time.time() stamp); ratios are of medians",
            "etcd_restart: driver and worker SIGKILLed back to back, the driver started again "
            "at once with the same command; the survivor finds it through etcd",
            "milestones: seconds from the kill (the restart for 'new driver' lines) to the "
            "first line of each kind after it; driver lines are stamped on arrival here",
        ],
        "variants": variants,
        "ratios": ratios,
        "trials": [r for v in VARIANTS for r in records[v]],
        "machine_load": load.summary(),
        "leftover_processes_sigkilled_at_end": [f"{p}: {a[:160]}" for p, a in leftovers.items()],
        "wall_s": round(time.monotonic() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    doc["table"] = markdown(doc)
    text = json.dumps(doc, indent=2)
    (RESULTS / "driver_restart.json").write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
