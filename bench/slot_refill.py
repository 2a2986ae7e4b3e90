"""Refilling a crashed worker's slot: SIGKILL of a worker to its replacement's first step,
with a warm standby waiting on its host and without, beside torchrun; and launch to the
first step of a fresh 2-worker job.

    python -m bench run slot_refill --trials 5           # on this machine
    python -m bench run slot_refill --trials 3 --bed     # on the multi-host bed (root)

Systems, interleaved per trial in a rotating order:

* `elasticrun`: warm standbys on (`--standby 1`);
* `elasticrun_no_standby`: `--standby 0` (the default), every replacement a cold start;
* `torchrun_tuned` (this machine only): as in bench/recovery.py; its agent restarts every
  worker, so its "replacement" is the restarted group.

On this machine the job is `bench/recovery.py`'s (2 workers on the host names `localhost` and
`127.0.0.1`, `--failure-scope worker`) with `--blacklist-cooldown-range 0 0`, so the dead
worker's host gets its replacement at once. On the bed (`--bed`) it is bench/host_faults.py's
4 hosts with one slot each, with the same two flags. Each trial:

1. launch; `launch_to_first_step_s`: to the first step at full size (a fresh job: standbys
   play no part in it);
2. train steadily, then wait until the job's standbys are ready (`/v1/status`; up to 60 s) or,
   without standbys, 5 s; `step_s_while_standby_starts`: rank 0's median step time from the
   first step to then (a standby imports torch meanwhile, at the lowest priority), and
   `step_s_steady` over the next 3 s (a standby waits: what a job that never fails pays);
3. SIGKILL rank 1's worker; `recovery_s`: to the first step of any worker after it;
   `refill_s`: to the first step of a process that did not train before (the replacement);
   `in_standby`: whether that process is the standby that waited (its pid);
4. stop every launcher; nothing may be left (a /proc scan; leftovers are reported).

The JSON document goes to stdout and to bench/results/slot_refill.json (`--bed`:
slot_refill_bed.json); each trial's transcript beside it; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.support.local_systems import (
    TUNED_MONITOR_INTERVAL,
    TUNED_RDZV_CONF,
    System,
    make_systems,
    write_hosts,
)
from bench.support.paths import RESULTS, ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.step_timing import first_step, steady, summarize
from bench.support.trial_processes import Launcher, Output, TrialFailed, free_port, stop_all

SYSTEMS = ["elasticrun", "elasticrun_no_standby", "torchrun_tuned"]
BED_SYSTEMS = ["elasticrun", "elasticrun_no_standby"]
METRICS = [
    "launch_to_first_step_s",
    "step_s_while_standby_starts",
    "step_s_steady",
    "recovery_s",
    "refill_s",
]
LAUNCH_TIMEOUT = 90.0
STEADY_TIMEOUT = 30.0
STANDBY_TIMEOUT = 60.0
REFILL_TIMEOUT = 60.0
STEADY_STEPS = 10
SETTLE = 5.0  # seconds the systems without standbys train before the kill
STEADY_WINDOW = 3.0  # seconds of steps timed once the standby waits (or after SETTLE)
REFILL_FLAGS = ["--blacklist-cooldown-range", "0", "0", "--failure-scope", "worker"]


def standbys_ready(job_id: str, job_files: Path) -> list[int]:
    """The pids of job `job_id`'s ready standbys (their keepers' where they have one), from
    `/v1/status`, its job file in `job_files` ([] when none or no answer)."""
    from elastic.driver.job_file import find_job

    try:
        job = find_job(job_id, job_files)
        answer = httpx.get(
            f"{job.urls.api}/v1/status",
            headers={"Authorization": f"Bearer {job.token}"},
            timeout=5,
        )
        standbys = answer.json().get("standbys", [])
    except Exception:  # noqa: BLE001 - not up yet, or between ports: ask again
        return []
    return [s["pid"] for s in standbys if s["ready"] and s["pid"]]


def standby_python_pids(folder: Path) -> set[int]:
    """Standby processes (not their keepers) whose environment names the trial's folder."""
    from tests.support.processes import standby_processes

    return standby_processes(str(folder))


class LocalJob:
    """One system on this machine: started by `start`, its launchers in `launchers`."""

    def __init__(self, name: str, folder: Path, out: Output) -> None:
        self.name, self.folder, self.out = name, folder, out
        self.job_id = f"refill-{uuid.uuid4().hex[:8]}"
        self.launchers: list[Launcher] = []
        self.size = 2
        self.commands: dict[str, str] = {}

    def start(self) -> None:
        systems = make_systems()
        env = dict(systems["elasticrun"].env, TMPDIR=str(self.folder))
        if self.name.startswith("elasticrun"):
            standby = "0" if self.name == "elasticrun_no_standby" else "1"
            system = System(
                self.name, "elasticrun", env,
                elastic_extra=[*REFILL_FLAGS, "--standby", standby, "--job-id", self.job_id],
            )  # fmt: skip
            hosts = self.folder / "hosts"
            write_hosts(hosts, ["localhost:1", "127.0.0.1:1"])
            env.update(ELASTIC_HOSTS_FILE=str(hosts), XDG_RUNTIME_DIR=str(self.folder))
            cmd = system.elasticrun_cmd(self.folder)
            self.launchers.append(Launcher("elasticrun", cmd, env, self.out, ROOT))
        else:
            system = systems[self.name]
            port, run_id = free_port(), f"bench-{uuid.uuid4().hex[:8]}"
            cmd = system.torchrun_cmd(self.folder, port, run_id)
            env = dict(system.env, TMPDIR=str(self.folder))
            for k in range(2):
                self.launchers.append(Launcher(f"agent{k}", cmd, env, self.out, ROOT))
        self.commands = {"launch": " ".join(cmd)}

    def standbys(self) -> set[int]:
        """The pids of the standbys waiting ready ({} when none is)."""
        if not standbys_ready(self.job_id, self.folder / "elasticrun"):
            return set()
        return standby_python_pids(self.folder)


class BedJob:
    """elasticrun on the multi-host bed (bench/host_faults.py's job), with or without
    standbys."""

    def __init__(self, name: str, folder: Path, out: Output, settings: argparse.Namespace):
        from bench.support.bed_systems import HOSTS, ElasticrunOnBed
        from tests.multihost.bed import Bed

        self.name, self.folder, self.out = name, folder, out
        self.job_id = f"refill-{uuid.uuid4().hex[:8]}"
        self.size = HOSTS
        self.bed = Bed(HOSTS, folder.parent / "beds" / folder.name)
        standby = "0" if name == "elasticrun_no_standby" else "1"
        self.job = ElasticrunOnBed(
            self.bed, folder, out, settings,
            flags=[*REFILL_FLAGS, "--standby", standby, "--job-id", self.job_id],
        )  # fmt: skip
        self.launchers = self.job.launchers
        self.commands: dict[str, str] = {}

    def start(self) -> None:
        self.job.start()
        self.commands = self.job.commands

    def standbys(self) -> set[int]:
        """The pids of the standbys waiting ready ({} when none is; the /proc scan sees the
        bed's hosts: they are network namespaces of this machine)."""
        from elastic.driver.job_file import runtime_dir

        if not standbys_ready(self.job_id, runtime_dir()):
            return set()
        return standby_python_pids(self.folder)

    def close(self) -> dict[str, Any]:
        from bench.support.bed_systems import clean_up

        return clean_up(self.folder, self.bed, self.job, None)


def run_trial(job: LocalJob | BedJob, rng: random.Random) -> dict[str, Any]:
    """One trial of one system; its record."""
    out, record = job.out, {"system": job.name, "ok": False}
    t_launch = time.time()
    phase = "launch"
    try:
        job.start()
        record["commands"] = job.commands
        size = job.size
        first = out.wait(
            f"the first step at size {size}",
            lambda o: first_step(o.steps, lambda s: s.size == size),
            LAUNCH_TIMEOUT,
            job.launchers,
        )
        record["launch_to_first_step_s"] = round(first.t - t_launch, 3)
        phase = "steady"
        out.wait(
            "steady training", steady(size, first, STEADY_STEPS), STEADY_TIMEOUT, job.launchers
        )
        phase = "standbys"
        t_wait = time.time()
        waiting: set[int] = set()
        if job.name == "elasticrun":
            while not (waiting := job.standbys()):
                if time.time() - t_wait > STANDBY_TIMEOUT:
                    raise TrialFailed(f"no standby ready within {STANDBY_TIMEOUT:g} s")
                time.sleep(0.2)
        else:  # as long as a standby takes to be ready here, for a like machine state
            time.sleep(SETTLE)
        t_ready = time.time()
        record["standby_wait_s"] = round(t_ready - t_wait, 3)
        time.sleep(STEADY_WINDOW)
        record["step_s_while_standby_starts"] = median_step(out, 0, first.t, t_ready)
        record["step_s_steady"] = median_step(out, 0, time.time() - STEADY_WINDOW, time.time())
        phase = "kill"
        time.sleep(rng.uniform(0.0, 0.3))
        with out.cond:
            victim = next(s for s in reversed(out.steps) if s.size == size and s.rank == 1)
            known = {s.pid for s in out.steps}
            t_kill = time.time()
            os.kill(victim.pid, signal.SIGKILL)
        phase = "refill"
        back = out.wait(
            "a step after the kill",
            lambda o: first_step(o.steps, lambda s: s.t > t_kill),
            REFILL_TIMEOUT,
            job.launchers,
        )
        record["recovery_s"] = round(back.t - t_kill, 3)
        fresh = out.wait(
            "the replacement's first step",
            lambda o: first_step(o.steps, lambda s: s.t > t_kill and s.pid not in known),
            REFILL_TIMEOUT,
            job.launchers,
        )
        record["refill_s"] = round(fresh.t - t_kill, 3)
        if job.name != "torchrun_tuned":
            record["in_standby"] = fresh.pid in waiting
        record["ok"] = True
    except Exception as err:  # noqa: BLE001 - any failure fails this trial, not the benchmark
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{phase}: {detail}"
    finally:
        if isinstance(job, BedJob):
            record["stop"] = job.close()
        else:
            record["stop"] = stop_all(job.launchers, str(job.folder))
        (job.folder.parent / f"{job.folder.name}.log").write_text(out.transcript(t_launch) + "\n")
    return record


def median_step(out: Output, rank: int, start: float, end: float) -> float | None:
    """The median time between consecutive steps of `rank` from `start` to `end`."""
    with out.cond:
        times = sorted(s.t for s in out.steps if s.rank == rank and start <= s.t <= end)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return round(statistics.median(gaps), 4) if gaps else None


def markdown(doc: dict[str, Any]) -> str:
    names = list(doc["systems"])
    rows = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in METRICS:
        cells = []
        for name in names:
            m = doc["systems"][name]["metrics"].get(key)
            cells.append(f"{m['median']} [{m['min']}–{m['max']}]" if m else "–")
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    ok = [f"{doc['systems'][n]['trials_ok']}/{doc['systems'][n]['trials']}" for n in names]
    rows.append("| trials ok | " + " | ".join(ok) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--systems", help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bed", action="store_true", help="on the multi-host bed (root)")
    args = parser.parse_args(argv)
    known = BED_SYSTEMS if args.bed else SYSTEMS
    names = [s for s in (args.systems or ",".join(known)).split(",") if s]
    if unknown := set(names) - set(known):
        parser.error(f"unknown systems here: {sorted(unknown)}")
    rng = random.Random(args.seed)
    stem = "slot_refill_bed" if args.bed else "slot_refill"
    logs = RESULTS / stem
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    start, load_before, code = time.perf_counter(), os.getloadavg(), git_state()
    with tempfile.TemporaryDirectory(prefix="slot-refill-") as tmp:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        for trial in range(args.trials):
            for name in names[trial % len(names) :] + names[: trial % len(names)]:
                folder = Path(tmp) / f"{name}-{trial}"
                folder.mkdir(parents=True)
                out = Output()
                job = BedJob(name, folder, out, args) if args.bed else LocalJob(name, folder, out)
                t0 = time.perf_counter()
                record = run_trial(job, rng)
                record.update(trial=trial, wall_s=round(time.perf_counter() - t0, 1))
                shutil.copy(Path(tmp) / f"{name}-{trial}.log", logs / f"{name}-{trial}.log")
                records[name].append(record)
                status = "ok" if record["ok"] else f"FAILED ({record['error']})"
                shown = ", ".join(
                    f"{k} {record[k]}" for k in [*METRICS, "in_standby"] if k in record
                )
                print(f"trial {trial} {name}: {status}; {shown}", file=sys.stderr, flush=True)
    import torch

    doc: dict[str, Any] = {
        "benchmark": stem,
        "command": command_line("slot_refill", argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "where": "the multi-host bed (4 hosts, 1 slot each)" if args.bed else "this machine",
        "flags": REFILL_FLAGS,
        "torchrun_tuned": {
            "rdzv_conf": TUNED_RDZV_CONF,
            "monitor_interval": TUNED_MONITOR_INTERVAL,
        },
        "systems": {},
        "trials": [],
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    for name in names:
        ok = [r for r in records[name] if r["ok"]]
        values = {k: [r[k] for r in ok if r.get(k) is not None] for k in METRICS}
        metrics = {k: summarize(v) for k, v in values.items() if v}
        doc["systems"][name] = {
            "trials": len(records[name]),
            "trials_ok": len(ok),
            "metrics": metrics,
            "in_standby": sum(1 for r in ok if r.get("in_standby")),
            "failures": [r["error"] for r in records[name] if not r["ok"]],
        }
        doc["trials"] += records[name]
    doc["table"] = markdown(doc)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2)
    (RESULTS / f"{stem}.json").write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)
