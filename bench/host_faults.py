"""Recovery across hosts: elasticrun against torchrun on the multi-host bed, when a worker
dies, a host vanishes, a host is cut off from the driver, and a vanished host comes back.

    python -m bench run host_faults --trials 3 [--systems elasticrun,torchrun] [--scenarios ...]

As root (the bed's network namespaces); about 4-5 minutes a trial (4 scenarios x 2 systems;
`--trials 3` took 13 minutes on 2 busy CPUs).

The bed (tests/multihost/bed.py) is 4 hosts, 1 slot each: network namespaces on one bridge,
each with its own sshd; the root namespace holds the driver's address. Every trial builds a
fresh bed and closes it afterwards, so trials are independent. Trials are interleaved: for
each trial index, every scenario runs once per system, in a rotating order.

The systems:

* `elasticrun`: the driver in the root namespace, the hosts from a discovery file
  (`-np 4 --min-np 1 --max-np 4 --heartbeat-interval 0.5`), every worker started through the
  bed's ssh;
* `torchrun`: one agent per host namespace (`bed.start`), `--nnodes=1:4 --nproc-per-node=1`,
  tuned as in bench/recovery.py plus what the bed's faults need (`torchrun_needs`, in
  the JSON). Its c10d rendezvous endpoint is a TCPStore of its own in the root namespace
  (bench/support/torchrun_store.py, every agent `is_host=false`), on the driver's address: where
  elasticrun's driver is and where no fault is injected. Served by an agent on a host, the
  store would die with that host, and torchrun could not recover at all.

Both train the same tiny MLP (bench/workloads/): every rank prints each step with its own
`time.time()`. The scenarios, each starting from 4 workers training steadily:

1. `worker_kill`: SIGKILL rank 1's worker process;
2. `host_vanish`: rank 1's host loses power (`bed.vanish`: no RST, no FIN, no reply);
3. `driver_partition`: rank 1's host is cut off from the root namespace, silently (elasticrun:
   from the driver; torchrun: from its rendezvous endpoint). The hosts still reach each other;
4. `host_return`: rank 1's host vanishes, stays away `--downtime` s after the vanish (the job
   re-forms without it meanwhile), then comes back (`bed.back`, same address, sshd up); it
   never left elasticrun's discovery file, and torchrun gets a fresh agent on it at once, as a
   rebooted machine's service manager would start one;
5. `worker_sigterm`: SIGTERM to rank 1's worker process (a spot reclaim's notice, a
   Kubernetes eviction): elasticrun's worker leaves at a step boundary; torchrun's dies and
   its agent restarts every worker.

Measured, from the workers' own step lines:

* `recovery_s` (1-3, 5; `vanish_recovery_s` in 4): fault injected to the first step completed
  by the re-formed job (a step at another size, or by a process that did not train before);
  `recovered_size`; `steps_lost` (the old job's last step, before the fault or, cut off, after
  it, minus the step the re-formed job resumed from); `stall_s`, the longest gap between
  consecutive steps (any rank) from the last step before the fault to that first step (or to
  the end of the wait): a job that trains on while cut off shows it;
* `scale_up_s` (4): host back (sshd answering) to the first step at size 4;
  `incumbent_stall_s`, the longest gap between consecutive steps of the incumbents' ranks
  across the scale-up (`step_interval_s`: their median gap before it); `scale_up_steps_lost`.

A system that does not recover within `--bound` seconds gets `null` and the reason, never a
made-up number. Every wait is bounded; a trial that hangs is recorded failed with its reason.
After each trial every launcher is stopped (SIGTERM, then SIGKILL), and nothing may be left:
neither a process naming the trial's folder anywhere (a /proc scan) nor any process but sshd
in a host's namespace, nor, once the bed is closed, any of its namespaces, links or nft table;
leftover processes are SIGKILLed by PID; everything left is reported (`leftovers`).

The JSON document goes to stdout and to `--out` (default bench/results/multihost.json); each
trial's transcript to the folder beside it named like it (bench/results/multihost/); progress
to stderr. The document: provenance (`command`, `git`, `torch`, `cpus`, `loadavg_1_5_15min`,
`wall_s`), the settings (`bed`, `workload`, `elasticrun`, `torchrun` with what it `needed`,
`bound_s`, `downtime_s`, `targets`, `notes`), `scenarios.SCENARIO.systems.SYSTEM` (per metric
`median`/`min`/`max`/`n` over the trials that had a value, `milestones` likewise,
`not_recovered` and `failures` with their reasons, `leftovers`, and elasticrun's `target` with
`met`), every trial's record in `trials`, and `table` (markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support.bed_systems import (
    COOLDOWN,
    DISCOVERY_INTERVAL,
    HEARTBEAT,
    HOSTS,
    PG_TIMEOUT,
    RDZV_ON_BED,
    START_TIMEOUT,
    SYSTEM_CLASSES,
    ElasticrunOnBed,
    TorchrunOnBed,
    clean_up,
    host_of,
    leftovers,
    torchrun_needs,
)
from bench.support.local_systems import (
    COMMIT_EVERY,
    ELASTIC_WORKLOAD,
    TORCHRUN_WORKLOAD,
    TUNED_MONITOR_INTERVAL,
    TUNED_RDZV_CONF,
)
from bench.support.paths import ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.step_timing import first_step, incumbent_stall, milestones, steady, summarize
from bench.support.trial_processes import Output, Step, TrialFailed
from tests.multihost.bed import Bed, BedUnavailable, missing_prerequisite

SYSTEMS = ["elasticrun", "torchrun"]
SCENARIOS = ["worker_kill", "host_vanish", "driver_partition", "host_return", "worker_sigterm"]
TARGETS = {  # elasticrun's targets: (metric, median at most, seconds)
    "worker_kill": ("recovery_s", 0.15),
    "host_vanish": ("recovery_s", 2.5),
    "worker_sigterm": ("stall_s", 0.3),
}

# Timeouts (s) of the waits of one trial; `--bound` is the recovery's.
LAUNCH_TIMEOUT = 120.0  # torchrun's 4 agents may form smaller groups first, then restart
STEADY_TIMEOUT = 30.0
SCALE_UP_TIMEOUT = 60.0
STEADY_STEPS = 10

METRICS = {
    "worker_kill": ["recovery_s", "recovered_size", "steps_lost", "stall_s"],
    "host_vanish": ["recovery_s", "recovered_size", "steps_lost", "stall_s"],
    "driver_partition": ["recovery_s", "recovered_size", "steps_lost", "stall_s"],
    "worker_sigterm": ["recovery_s", "recovered_size", "steps_lost", "stall_s"],
    "host_return": [
        "vanish_recovery_s",
        "scale_up_s",
        "incumbent_stall_s",
        "step_interval_s",
        "scale_up_steps_lost",
    ],
}


# Milestones per (system, scenario): (label, pattern, stamp); "worker" lines carry their own
# time.time(), "arrival" lines (driver and agent logs) are stamped when read here.
_TORCHRUN_RESTART = [
    ("agents: rendezvous complete", r"Rendezvous complete for workers", "arrival"),
    ("new worker: process up", r"event process up", "worker"),
    ("new worker: init_process_group done", r"event initialized", "worker"),
    ("checkpoint loaded, DDP built", r"enter \d+ size", "worker"),
    ("first step of the new group", r"step \d+ size", "worker"),
]
MILESTONES: dict[tuple[str, str], list[tuple[str, str, str]]] = {
    ("elasticrun", "worker_kill"): [
        ("survivor: collective failed", r"elastic: rank \d+: .*failed", "worker"),
        ("driver: saw the death", r"elasticrun: rank \d+ .*killed by signal", "arrival"),
        ("driver: round at size 3 formed", r"elasticrun: round \d+: 3 worker", "arrival"),
        ("survivor: entered new round", r"event reset size 3", "worker"),
        ("first step at size 3", r"step \d+ size 3", "worker"),
    ],
    ("elasticrun", "host_vanish"): [
        ("driver: declared the host dead", r"missed \d+ heartbeats", "arrival"),
        ("driver: round at size 3 formed", r"elasticrun: round \d+: 3 worker", "arrival"),
        ("survivor: entered new round", r"event reset size 3", "worker"),
        ("first step at size 3", r"step \d+ size 3", "worker"),
    ],
    ("torchrun", "worker_kill"): [
        ("agent: saw the death", r"failed \(exitcode: -9\)", "arrival"),
        *_TORCHRUN_RESTART,
    ],
    ("torchrun", "host_vanish"): [
        ("survivor: collective timed out", r"Timed out waiting", "arrival"),
        ("agent: saw the failure", r"Worker group FAILED", "arrival"),
        *_TORCHRUN_RESTART,
    ],
    ("torchrun", "driver_partition"): [
        ("cut-off agent: gave up", r"RendezvousConnectionError|connection to the C10d", "arrival"),
        *_TORCHRUN_RESTART,
    ],
}
MILESTONES[("elasticrun", "driver_partition")] = MILESTONES[("elasticrun", "host_vanish")]
MILESTONES[("elasticrun", "worker_sigterm")] = [
    ("driver: the leave taken", r"leaves the job: SIGTERM", "arrival"),
    ("driver: round at size 3 formed", r"elasticrun: round \d+: 3 worker", "arrival"),
    ("survivor: entered new round", r"event reset size 3", "worker"),
    ("first step at size 3", r"step \d+ size 3", "worker"),
]
MILESTONES[("torchrun", "worker_sigterm")] = [
    ("agent: saw the exit", r"failed \(exitcode: ", "arrival"),
    *_TORCHRUN_RESTART,
]
MILESTONES[("elasticrun", "host_return")] = [
    ("driver: launched on the returned host", r"elasticrun: launched \d+ worker", "arrival"),
    ("joiner: process up", r"event process up", "worker"),
    ("driver: round at size 4 formed", r"elasticrun: round \d+: 4 worker", "arrival"),
    ("incumbent: entered new round", r"event reset size 4", "worker"),
    ("joiner: hvd.init() done", r"event initialized size 4", "worker"),
    ("first step at size 4", r"step \d+ size 4", "worker"),
]
MILESTONES[("torchrun", "host_return")] = [
    ("agents: new node detected", r"Detected \d+ new nodes", "arrival"),
    *_TORCHRUN_RESTART,
]

NOTES = [
    "times are seconds from the fault (or the host's return) to the first step line of each "
    "kind after it, from the workers' own time.time() stamps; one machine, one clock",
    f"elasticrun: --heartbeat-interval {HEARTBEAT:g}: a host that misses 3 heartbeats is "
    "declared dead; --blacklist-cooldown-range "
    f"{COOLDOWN[0]:g} {COOLDOWN[1]:g}: after a failure a host gets no worker for 1-2 s. A "
    "vanished host that stays in discovery gets a worker launched again once its cooldown "
    "ends, while it is still away: that ssh connection waits on TCP's SYN retries (up to "
    f"--start-timeout {START_TIMEOUT} s), so in host_return the host is reached at the first "
    "retry after it is back, and `scale_up_s` includes that wait (milestone `joiner: process "
    "up`; `driver: launched on the returned host` is absent when the launch was made before)",
    "torchrun restarts every worker on any change: its re-formed job is new processes that "
    "load rank 0's last checkpoint (written to a file every 5 steps, on the machine's one "
    "file system, as on shared storage); elasticrun re-forms in the surviving processes from "
    "their last in-memory commit (every 5 steps)",
]


# --- one trial ------------------------------------------------------------------------------


def is_reformed(known: set[int], size: int, t_fault: float) -> Callable[[Step], bool]:
    """A step of the job re-formed after the fault: later, and at another size or by a
    process that had not trained before it (torchrun's restarted group)."""
    return lambda s: s.t > t_fault and (s.size != size or s.pid not in known)


def longest_gap(out: Output, start: float, end: float, open_end: bool = False) -> float | None:
    """The longest gap between consecutive step lines (any rank) from the last one at or
    before `start` to `end`; with `open_end`, `end` counts as a step (a wait that ran out)."""
    with out.cond:
        times = sorted(s.t for s in out.steps)
    before = [t for t in times if t <= start]
    window = [*before[-1:], *(t for t in times if start < t <= end), *([end] if open_end else [])]
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    return max(gaps) if gaps else None


def what_happened(out: Output, known: set[int], t_fault: float) -> str:
    """After a recovery wait ran out: what the job did after the fault, in one line."""
    with out.cond:
        after = [s for s in out.steps if s.t > t_fault]
    if not after:
        return "no step at all since the fault"
    old = [s for s in after if s.pid in known]
    sizes = sorted({s.size for s in after})
    last = max(s.t for s in after) - t_fault
    return (
        f"{len(after)} steps since the fault (sizes {sizes}), {len(old)} of them by the "
        f"processes training before it; the last at +{last:.1f} s"
    )


def trained_by(out: Output, until: float) -> set[int]:
    """The processes that printed a step line up to `until`."""
    with out.cond:
        return {s.pid for s in out.steps if s.t <= until}


def recover(
    out: Output,
    record: dict[str, Any],
    key: str,
    job: ElasticrunOnBed | TorchrunOnBed,
    t_fault: float,
    bound: float,
) -> Step:
    """Wait up to `bound` s for the re-formed job's first step; record `key` (seconds) and the
    recovery's other figures, or `key` = None and `not_recovered` (then raise TrialFailed)."""
    known = trained_by(out, t_fault)
    reformed = is_reformed(known, HOSTS, t_fault)
    try:
        back = out.wait(
            "the re-formed job's first step",
            lambda o: first_step(o.steps, reformed),
            bound,
            job.agents,
        )
    except TrialFailed as err:
        record[key] = None
        record["not_recovered"] = f"{err}; {what_happened(out, known, t_fault)}"
        stall = longest_gap(out, t_fault, time.time(), open_end=True)  # or trained on
        record["stall_s"] = round(stall, 3) if stall is not None else None
        raise
    record[key] = round(back.t - t_fault, 3)
    record["recovered_size"] = back.size
    with out.cond:  # the old job may train on after the fault (a partition)
        last = max(s.step for s in out.steps if s.t < back.t and not reformed(s))
    record["steps_lost"] = last - (back.step - 1)
    stall = longest_gap(out, t_fault, back.t)
    record["stall_s"] = round(stall, 3) if stall is not None else None
    return back


def inject(bed: Bed, scenario: str, victim: Step, host: str) -> float:
    """Inject the scenario's fault into `victim` (rank 1's step line) or its `host`; return
    the time it was injected."""
    t_fault = time.time()
    if scenario == "worker_kill":
        os.kill(victim.pid, signal.SIGKILL)
    elif scenario == "worker_sigterm":
        os.kill(victim.pid, signal.SIGTERM)
    elif scenario in ("host_vanish", "host_return"):
        bed.vanish(host)
    elif scenario == "driver_partition":
        bed.partition(host, from_="driver")
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    return t_fault


def run_trial(
    system: str,
    scenario: str,
    folder: Path,
    rng: random.Random,
    settings: argparse.Namespace,
) -> dict[str, Any]:
    """One scenario of one system on a fresh bed; the trial's record."""
    folder.mkdir(parents=True)
    out = Output()
    record: dict[str, Any] = {"system": system, "scenario": scenario, "ok": False}
    bed: Bed | None = None
    job: ElasticrunOnBed | TorchrunOnBed | None = None
    host: str | None = None
    t_start = time.time()
    phase = "bed"
    try:
        # Not inside `folder`: the sshd command lines must not name the trial's folder.
        bed = Bed(HOSTS, folder.parent / "beds" / folder.name)
        record["bed_s"] = round(time.time() - t_start, 3)
        phase = "launch"
        t_launch = time.time()
        job = SYSTEM_CLASSES[system](bed, folder, out, settings)
        job.start()
        record["commands"] = job.commands
        first = out.wait(
            f"the first step at size {HOSTS}",
            lambda o: first_step(o.steps, lambda s: s.size == HOSTS),
            LAUNCH_TIMEOUT,
            job.agents,
        )
        record["launch_to_first_step_s"] = round(first.t - t_launch, 3)
        phase = f"steady at size {HOSTS}"
        out.wait("steady training", steady(HOSTS, first, STEADY_STEPS), STEADY_TIMEOUT, job.agents)

        phase = "fault"
        time.sleep(rng.uniform(0.0, 0.3))  # a random point between commits
        with out.cond:
            victim = next(s for s in reversed(out.steps) if s.size == HOSTS and s.rank == 1)
        host = host_of(bed, victim.pid)
        record["victim"] = {"rank": 1, "pid": victim.pid, "host": host}
        t_fault = inject(bed, scenario, victim, host)
        record["fault_at_s"] = round(t_fault - t_start, 3)  # in the trial's transcript
        record["fault_call_s"] = round(time.time() - t_fault, 3)
        phase = "recovery"
        key = "vanish_recovery_s" if scenario == "host_return" else "recovery_s"
        back = recover(out, record, key, job, t_fault, settings.bound)
        # torchrun's milestones come from its new group: leave out the old group's lines.
        old = trained_by(out, t_fault) if system == "torchrun" else set()
        if scenario != "host_return":
            spec = MILESTONES[(system, scenario)]
            record["milestones"] = milestones(out, spec, t_fault, old)
        else:
            phase = "steady without the host"
            out.wait(
                "steady training", steady(back.size, back, STEADY_STEPS), STEADY_TIMEOUT, job.agents
            )
            time.sleep(max(0.0, t_fault + settings.downtime - time.time()))
            phase = "scale up"
            record["down_s"] = round(time.time() - t_fault, 3)
            t_call = time.time()
            bed.back(host)
            t_back = time.time()
            record["back_call_s"] = round(t_back - t_call, 3)
            job.host_returned(host)
            grown = out.wait(
                f"a step at size {HOSTS}",
                lambda o: first_step(o.steps, lambda s: s.size == HOSTS and s.t > t_back),
                SCALE_UP_TIMEOUT,
                job.agents,
            )
            record["scale_up_s"] = round(grown.t - t_back, 3)
            with out.cond:
                before = [s.step for s in out.steps if s.size < HOSTS and s.t < grown.t]
            record["scale_up_steps_lost"] = max(before) - (grown.step - 1)
            out.wait(
                "steady training", steady(HOSTS, grown, STEADY_STEPS), STEADY_TIMEOUT, job.agents
            )
            stall, interval = incumbent_stall(out, t_back, size=HOSTS)
            record["incumbent_stall_s"] = round(stall, 3) if stall is not None else None
            record["step_interval_s"] = round(interval, 3) if interval is not None else None
            old = trained_by(out, t_back) if system == "torchrun" else set()
            record["milestones"] = milestones(out, MILESTONES[(system, scenario)], t_back, old)
        record["ok"] = True
    except Exception as err:  # noqa: BLE001 - any failure fails this trial, not the benchmark
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{phase}: {detail}"
    finally:
        cut = host if scenario == "driver_partition" else None
        record["stop"] = clean_up(folder, bed, job, cut)
        (folder.parent / f"{folder.name}.log").write_text(out.transcript(t_start) + "\n")
    return record


# --- the benchmark --------------------------------------------------------------------------


def summarize_cell(scenario: str, system: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, min and max of one scenario x system, what did not recover, and why."""
    metrics = {}
    for key in METRICS[scenario]:
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            metrics[key] = summarize(values)
    labels = next((list(r["milestones"]) for r in records if "milestones" in r), [])
    phases = {}
    for label in labels:
        values = [r["milestones"][label] for r in records if r.get("milestones", {}).get(label)]
        if values:
            phases[label] = summarize(values)
    cell: dict[str, Any] = {
        "trials": len(records),
        "trials_ok": sum(r["ok"] for r in records),
        "metrics": metrics,
        "milestones": phases,
        "not_recovered": [
            f"trial {r['trial']}: {r['not_recovered']}" for r in records if "not_recovered" in r
        ],
        "failures": [f"trial {r['trial']}: {r['error']}" for r in records if "error" in r],
        "leftovers": sum(leftovers(r) for r in records),
    }
    if system == "elasticrun" and scenario in TARGETS:
        metric, limit = TARGETS[scenario]
        median = metrics.get(metric, {}).get("median")
        cell["target"] = {
            "metric": metric,
            "median_at_most": limit,
            "met": median is not None and median <= limit and cell["trials_ok"] == len(records),
        }
    return cell


def markdown(doc: dict[str, Any]) -> str:
    systems = doc["systems_run"]
    rows = [
        "| scenario | metric | " + " | ".join(systems) + " |",
        "|---" * (len(systems) + 2) + "|",
    ]
    for scenario, cells in doc["scenarios"].items():
        for key in METRICS[scenario]:
            row = []
            for name in systems:
                cell = cells["systems"].get(name, {})
                m = cell.get("metrics", {}).get(key)
                missing = cell.get("trials", 0) - (m["n"] if m else 0)
                text = f"{m['median']:g} [{m['min']:g}–{m['max']:g}]" if m else ""
                none = f"{missing} none" if missing else ""
                row.append(f"{text} ({none})" if text and none else text or none or "—")
            rows.append(f"| {scenario} | {key} | " + " | ".join(row) + " |")
        ok = [
            f"{cells['systems'][s]['trials_ok']}/{cells['systems'][s]['trials']}"
            if s in cells["systems"]
            else "—"
            for s in systems
        ]
        rows.append(f"| {scenario} | trials ok | " + " | ".join(ok) + " |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    parser.add_argument(
        "--bound", type=float, default=60.0, help="seconds a recovery may take (default 60)"
    )
    parser.add_argument(
        "--downtime",
        type=float,
        default=20.0,
        help="host_return: seconds from the vanish to the host's return (default 20)",
    )
    parser.add_argument(
        "--torchrun-pg-timeout",
        type=float,
        default=PG_TIMEOUT,
        help=f"torchrun workload's process group timeout, s (default {PG_TIMEOUT:g}; 0: "
        "torch's default, 30 minutes)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "multihost.json", help="JSON"
    )
    args = parser.parse_args(argv)
    for flag, names, known in (
        ("--systems", args.systems, SYSTEMS),
        ("--scenarios", args.scenarios, SCENARIOS),
    ):
        chosen = [s for s in names.split(",") if s]
        if unknown := set(chosen) - set(known):
            parser.error(f"{flag}: unknown {sorted(unknown)} (known: {', '.join(known)})")
        setattr(args, flag[2:], chosen)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    args = parse_args(argv)
    if reason := missing_prerequisite():
        sys.exit(f"multihost: no bed on this machine: {reason}")
    try:
        Bed(1).close()  # fail early, in one line, where the kernel refuses a bed
    except BedUnavailable as err:
        sys.exit(f"multihost: no bed on this machine: {err}")
    rng = random.Random(args.seed)
    logs = args.out.with_suffix("")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    load_before = os.getloadavg()
    code = git_state()  # at the start: what the trials run
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        # A SIGTERM to the benchmark unwinds through the trials' cleanup like a Ctrl-C.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        for trial in range(args.trials):
            for index, scenario in enumerate(args.scenarios):
                turn = (trial + index) % len(args.systems)
                for system in args.systems[turn:] + args.systems[:turn]:
                    name = f"{scenario}-{system}-{trial}"
                    t0 = time.perf_counter()
                    record = run_trial(system, scenario, Path(tmp) / name, rng, args)
                    record["trial"] = trial
                    record["wall_s"] = round(time.perf_counter() - t0, 1)
                    shutil.copy(Path(tmp) / f"{name}.log", logs / f"{name}.log")
                    records.append(record)
                    status = "ok" if record["ok"] else f"FAILED ({record['error']})"
                    figures = ", ".join(
                        f"{k} {record[k]}" for k in METRICS[scenario] if k in record
                    )
                    print(
                        f"trial {trial} {scenario} {system}: {status} in {record['wall_s']} s; "
                        f"{figures}; leftovers {leftovers(record)}",
                        file=sys.stderr,
                        flush=True,
                    )
    import torch

    doc: dict[str, Any] = {
        "benchmark": "multihost",
        "command": command_line("host_faults", argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "bed": {
            "hosts": HOSTS,
            "slots_per_host": 1,
            "what": "network namespaces on one bridge, each with its own sshd "
            "(tests/multihost/bed.py); a fresh bed per trial",
        },
        "workload": {
            "model": "MLP 64-768-768-768-1, SGD, 80 samples per rank and step, 1 thread",
            "commit_every_steps": COMMIT_EVERY,
            "elasticrun": str(ELASTIC_WORKLOAD.relative_to(ROOT)),
            "torchrun": str(TORCHRUN_WORKLOAD.relative_to(ROOT)),
        },
        "elasticrun": {
            "heartbeat_interval_s": HEARTBEAT,
            "discovery_interval_s": DISCOVERY_INTERVAL,
            "blacklist_cooldown_range_s": list(COOLDOWN),
        },
        "torchrun": {
            "rdzv_endpoint": "a TCPStore process of its own (bench/support/torchrun_store.py) in "
            "the root namespace, on the driver's address, where no fault is injected; no agent "
            "serves it (is_host=false). On a host, it would die with the host, and torchrun "
            "could not recover at all",
            "rdzv_conf": f"{TUNED_RDZV_CONF},{RDZV_ON_BED}",
            "monitor_interval_s": float(TUNED_MONITOR_INTERVAL),
            "pg_timeout_s": args.torchrun_pg_timeout or None,
            "needed": torchrun_needs(args.torchrun_pg_timeout),
        },
        "bound_s": args.bound,
        "downtime_s": args.downtime,
        "targets": {s: {"metric": m, "median_at_most": v} for s, (m, v) in TARGETS.items()},
        "notes": NOTES,
        "systems_run": args.systems,
        "scenarios": {},
        "trials": records,
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    for scenario in args.scenarios:
        cells = {}
        for system in args.systems:
            mine = [r for r in records if r["scenario"] == scenario and r["system"] == system]
            cells[system] = summarize_cell(scenario, system, mine)
        doc["scenarios"][scenario] = {"systems": cells}
    doc["table"] = markdown(doc)
    text = json.dumps(doc, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
