"""Sharded recovery: an FSDP2 model no rank holds whole, under elasticrun (`ShardedState`:
commits in host memory replicated to the other host, re-sharded in the running processes)
and under torchrun (a DCP checkpoint on local disk, every worker restarted), side by side.

    python -m bench run sharded_recovery                      (a ~5M-parameter model)
    python -m bench run sharded_recovery --dim 768 --layers 12 --vocab 8192 --wait-s 900
                                                               (~98M parameters: the target's)

Both systems run the same workload (`bench/workloads/sharded_*.py`: the language model of
`transformer.py`, Adam, the same tokens) on 4 ranks over 2 host names, 2 each
(`bench/support/sharded_jobs.py` launches them, tuned as in `bench/recovery.py`), commit
(elasticrun, in memory, `--replicas` copies on the other host) or checkpoint (torchrun, DCP,
local disk) every `--commit-every` steps after `--quiet-steps` steps without. Each trial, per
system (the systems take turns, in a rotating order):

1. launch; once rank 0 has done `quiet + commit-steps + 1` steps, the step time with and
   without commits: the mean time between rank 0's consecutive steps over steps 3..quiet
   (`step_s_no_commits`) and over the next `commit-steps` steps, each commit's time
   included (`step_s_with_commits`); `commit_cost_pct` compares them; `commit_blocking_s`
   is the median time `state.commit()` (elasticrun) or the checkpoint (torchrun) held the
   step; elasticrun's host memory per rank at rest and at its peak, against `1 + replicas`
   times its share of the state (`bench/support/sharded_metrics.py` says how);
2. at a random point, SIGKILL one worker (elasticrun: one on 127.0.0.1; torchrun: rank 3):
   `recovery_s`, from the SIGKILL to the first step the job completes after it (elasticrun
   goes on with 3 ranks; torchrun restarts all 4 and loads its checkpoint), `steps_lost`
   (the last step done before the SIGKILL minus the step the job resumed from);
3. elasticrun only: grow 3 -> 4, a third host name added to the discovery file:
   `scale_up_s` (to the first step at size 4), `joiner_first_step_s` (the joiner's process
   start to its first step), `incumbent_stall_s` (the longest gap between two steps of a
   rank that trained before; `step_interval_s`, the median gap at size 3, for comparison);
4. a host "vanishes": both workers of one host name (torchrun: the agent too) SIGKILLed at
   once, the name removed from the discovery file: `host_recovery_s`, `host_steps_lost`.

Where the recovery's time goes: elasticrun's workload prints the seconds of each phase of the
re-form (re-join, agree, re-wrap, transfer, to DTensor, snapshot; see the workload's
docstring), summed per rank (the slowest rank's) between the fault and the first step after
it; and both systems' milestones (driver or agent log lines stamped on arrival here, worker
lines with their own time) in seconds from the fault. Every wait is bounded (`--wait-s`);
a trial that fails is recorded with its reason. The JSON document goes to stdout and to
`--out` (default bench/results/sharded_recovery.json), each trial's transcript to
bench/results/sharded_recovery/, progress to stderr. Nothing here is asserted: the targets
(commits at most 5 % of step time, recovery within 3 s and at least 5x faster than torchrun,
no step lost beyond the commit interval) are reported with `met`.
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
from pathlib import Path
from typing import Any

from bench.support.local_systems import third_host
from bench.support.machine_load import OtherLoad
from bench.support.paths import RESULTS
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.sharded_jobs import ElasticJob, TorchrunJob
from bench.support.sharded_metrics import mean_step_s, memory, metric_values, phase_seconds
from bench.support.sharded_report import METRICS, SYSTEMS, markdown, summarize_system, targets
from bench.support.step_timing import first_step, milestones
from bench.support.trial_processes import Output, Step, TrialFailed
from bench.workloads.transformer import parameter_count

# Milestones of each fault, per system: (label, pattern, stamp) as in bench/recovery.py.
RECOVERY_MILESTONES = {
    "elasticrun": [
        ("survivor: failure seen, restoring", r"restoring the last commit", "worker"),
        ("driver: saw the death", r"elasticrun: rank \d+ .*killed by signal", "arrival"),
        ("driver: new round formed", r"elasticrun: round \d+: \d+ worker", "arrival"),
        ("survivor: re-joined", r"\bphase rejoin ", "worker"),
        ("survivor: state re-formed", r"\bphase sync ", "worker"),
        ("training entered", r"\benter \d+ size {size}", "worker"),
        ("first step", r"\bstep \d+ size {size}", "worker"),
    ],
    "torchrun": [
        ("agent: saw the death", r"failed \(exitcode: -?\d+\)", "arrival"),
        ("agents: rendezvous complete", r"Rendezvous complete for workers", "arrival"),
        ("new worker: process up", r"event process up", "worker"),
        ("new worker: python + imports done", r"event started", "worker"),
        ("new worker: init_process_group done", r"event initialized", "worker"),
        ("new worker: model built and sharded", r"event ready", "worker"),
        ("new worker: checkpoint loaded", r"\bmetric load_s ", "worker"),
        ("first step", r"\bstep \d+ size", "worker"),
    ],
}
GROW_MILESTONES = [
    ("driver: hosts available", r"elasticrun: hosts available", "arrival"),
    ("driver: launched the joiner", r"elasticrun: launched \d+ worker", "arrival"),
    ("joiner: process up", r"event process up", "worker"),
    ("joiner: python + imports done", r"event started", "worker"),
    ("driver: round at size 4 formed", r"elasticrun: round \d+: 4 worker", "arrival"),
    ("joiner: hvd.init() done", r"event initialized size 4", "worker"),
    ("joiner: model built and sharded", r"event ready size 4", "worker"),
    ("incumbent: re-joined", r"\bphase rejoin ", "worker"),
    ("state re-formed", r"\bphase sync ", "worker"),
    ("first step at size 4", r"\bstep \d+ size 4", "worker"),
]


def workload_args(args: argparse.Namespace) -> list[str]:
    return [
        "--commit-every", str(args.commit_every), "--quiet-steps", str(args.quiet_steps),
        "--dim", str(args.dim), "--layers", str(args.layers), "--vocab", str(args.vocab),
        "--seq", str(args.seq), "--batch", str(args.batch), "--max-seconds", str(args.max_s),
    ]  # fmt: skip


def wait_step(out: Output, what: str, accept, args, job) -> Step:
    """The first step `accept` takes, waited for at most `--wait-s`."""
    return out.wait(what, lambda o: first_step(o.steps, accept), args.wait_s, job.launchers)


def known_pids(out: Output) -> set[int]:
    with out.cond:
        return {s.pid for s in out.steps}


def last_step_before(out: Output, t: float, size: int | None = None) -> int:
    """The highest step done before `t` (at `size`, when given)."""
    with out.cond:
        return max(s.step for s in out.steps if s.t <= t and size in (None, s.size))


def steady_window(out: Output, job: Any, args: argparse.Namespace, record: dict) -> float:
    """Step 1 of the module's docstring; returns when it ended."""
    quiet, measured = args.quiet_steps, args.quiet_steps + args.commit_steps + 1
    wait_step(out, f"step {measured}", lambda s: s.rank == 0 and s.step >= measured, args, job)
    with out.cond:
        steps = [s for s in out.steps if s.size == 4]
    record["step_s_no_commits"] = mean_step_s(steps, 0, 3, quiet)
    record["step_s_with_commits"] = mean_step_s(steps, 0, quiet + 2, measured)
    if record["step_s_no_commits"] and record["step_s_with_commits"]:
        ratio = record["step_s_with_commits"] / record["step_s_no_commits"]
        record["commit_cost_pct"] = 100 * (ratio - 1)
    blocking = metric_values(out, "commit_s" if job.kind == "elasticrun" else "checkpoint_s")
    if blocking:
        record["commit_blocking_s"] = statistics.median(blocking)
    now = time.time()
    if job.kind == "elasticrun":
        record["memory"] = memory(out, args.replicas, now)
    return now


def pause_between_commits(out: Output, rng: random.Random) -> None:
    """Sleep a random fraction of one step, so the fault lands anywhere in a step."""
    with out.cond:
        tail = [s.t for s in out.steps if s.rank == 0][-3:]
    step = (tail[-1] - tail[0]) / 2 if len(tail) == 3 else 0.2
    time.sleep(rng.uniform(0.0, step))


def fault(
    out: Output, job: Any, args: argparse.Namespace, record: dict, key: str, t_fault: float,
    resumed, old: set[int],
) -> Step:  # fmt: skip
    """After a fault at `t_fault`: wait for the first step `resumed` takes; record the
    recovery (`key`_s), the steps lost, the phases and the milestones."""
    back = wait_step(out, f"a step after the {key}", resumed, args, job)
    lost_key = "steps_lost" if key == "recovery" else "host_steps_lost"
    record[f"{key}_s"] = back.t - t_fault
    record[f"{key}_size"] = back.size
    record[lost_key] = last_step_before(out, t_fault) - (back.step - 1)
    if job.kind == "elasticrun":
        record[f"{key}_phases_s"] = phase_seconds(out, t_fault, back.t)
    spec = [(label, pattern.replace("{size}", str(back.size)), stamp)
            for label, pattern, stamp in RECOVERY_MILESTONES[job.kind]]  # fmt: skip
    record[f"{key}_milestones"] = milestones(out, spec, t_fault, old)
    after = back.step + args.steady_steps
    wait_step(out, f"step {after}", lambda s: s.step >= after and s.t > back.t, args, job)
    return back


def grow(out: Output, job: ElasticJob, args: argparse.Namespace, record: dict, line: str) -> None:
    """Step 3 of the module's docstring."""
    incumbents = {s.pid for s in out.steps if s.size == 3}
    t_add = time.time()
    job.add_host(line)
    first4 = wait_step(out, "a step at size 4", lambda s: s.size == 4 and s.t > t_add, args, job)
    record["scale_up_s"] = first4.t - t_add
    record["scale_up_steps_lost"] = last_step_before(out, first4.t, 3) - (first4.step - 1)
    joiner = wait_step(
        out, "the joiner's step", lambda s: s.size == 4 and s.pid not in incumbents, args, job
    )
    with out.cond:
        up = [x.stamp for x in out.lines if f"event process up pid {joiner.pid} " in x.text]
        steps = list(out.steps)
    if up and up[0] is not None:
        record["joiner_first_step_s"] = joiner.t - up[0]
    stall, gaps = 0.0, []
    for pid in incumbents:
        times = sorted(s.t for s in steps if s.pid == pid)
        before = [t for t in times if t < t_add]
        mine4 = [s.t for s in steps if s.pid == pid and s.size == 4 and s.t > t_add]
        if not before or not mine4:
            continue
        window = [t for t in times if before[-1] <= t <= mine4[0]]
        stall = max([stall, *(b - a for a, b in zip(window, window[1:], strict=False))])
        small = sorted(s.t for s in steps if s.pid == pid and s.size == 3 and s.t < t_add)
        gaps += [b - a for a, b in zip(small, small[1:], strict=False)]
    record["incumbent_stall_s"] = stall
    record["step_interval_s"] = statistics.median(gaps) if gaps else None
    record["scale_up_milestones"] = milestones(out, GROW_MILESTONES, t_add)
    after = first4.step + args.steady_steps
    wait_step(out, f"step {after}", lambda s: s.step >= after and s.size == 4, args, job)


def elastic_trial(args, folder: Path, out: Output, rng: random.Random, record: dict, jobs) -> None:
    job = ElasticJob(folder, out, workload_args(args))
    jobs.append(job)
    record["commands"] = job.commands()
    t_launch = time.time()
    first = wait_step(out, "the first step at size 4", lambda s: s.size == 4, args, job)
    record["launch_to_first_step_s"] = first.t - t_launch
    steady_window(out, job, args, record)
    record["phase"] = "worker kill"
    pause_between_commits(out, rng)
    hosts = job.hosts_of()
    with out.cond:
        live = [s for s in reversed(out.steps) if s.size == 4 and hosts.get(s.pid) == "127.0.0.1"]
        victim = max(live[:8], key=lambda s: s.rank)
        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL)
    fault(out, job, args, record, "recovery", t_kill, lambda s: s.size == 3 and s.t > t_kill, set())
    record["phase"] = "grow 3 -> 4"
    add_line, _ = third_host()
    grow(out, job, args, record, add_line)
    record["phase"] = "host lost"
    hosts = job.hosts_of()
    with out.cond:
        t_grown = max(s.t for s in out.steps)
        pids = sorted({s.pid for s in out.steps if s.size == 4 and s.t >= t_grown - 60})
    victims = [pid for pid in pids if hosts.get(pid) == "localhost"]
    record["host_lost"] = {"host": "localhost", "workers": len(victims)}
    pause_between_commits(out, rng)
    t_vanish = time.time()
    job.vanish("localhost", victims)
    resumed = lambda s: s.size == 4 - len(victims) and s.t > t_vanish  # noqa: E731
    fault(out, job, args, record, "host_recovery", t_vanish, resumed, set())


def torchrun_trial(args, folder: Path, out: Output, rng: random.Random, record: dict, jobs) -> None:
    job = TorchrunJob(folder, out, workload_args(args))
    jobs.append(job)
    job.start(args.wait_s)
    record["commands"] = job.commands()
    t_launch = time.time()
    first = wait_step(out, "the first step at size 4", lambda s: s.size == 4, args, job)
    record["launch_to_first_step_s"] = first.t - t_launch
    steady_window(out, job, args, record)
    record["phase"] = "worker kill"
    pause_between_commits(out, rng)
    with out.cond:
        victim = next(s for s in reversed(out.steps) if s.size == 4 and s.rank == 3)
        old = {s.pid for s in out.steps}
        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL)
    fault(out, job, args, record, "recovery", t_kill, lambda s: s.pid not in old, old)
    record["phase"] = "host lost"
    pause_between_commits(out, rng)
    old = known_pids(out)
    t_vanish = time.time()
    record["host_lost"] = {"agent": 1, "processes": len(job.vanish(1))}
    resumed = lambda s: s.pid not in old and s.t > t_vanish  # noqa: E731
    fault(out, job, args, record, "host_recovery", t_vanish, resumed, old)


def run_trial(name: str, args, folder: Path, rng: random.Random) -> dict[str, Any]:
    """One trial of system `name`; its record (metrics, milestones, phases, error, stop)."""
    folder.mkdir(parents=True)
    out = Output()
    record: dict[str, Any] = {"system": name, "ok": False, "phase": "launch"}
    t0 = time.time()
    jobs: list[ElasticJob | TorchrunJob] = []
    try:
        trial = elastic_trial if name == "elasticrun" else torchrun_trial
        trial(args, folder, out, rng, record, jobs)
        record["ok"] = True
    except Exception as err:  # noqa: BLE001 - any failure fails this trial, not the benchmark
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{record['phase']}: {detail}"
    finally:
        for job in jobs:
            record["stop"] = job.stop()
        (folder.parent / f"{folder.name}.log").write_text(out.transcript(t0) + "\n")
    del record["phase"]
    for key in METRICS:
        if isinstance(record.get(key), float):
            record[key] = round(record[key], 3)
    return record


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--dim", type=int, default=256, help="model width (default 256)")
    parser.add_argument("--layers", type=int, default=4, help="blocks (default 4)")
    parser.add_argument("--vocab", type=int, default=4096, help="tokens (default 4096)")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank and step")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--quiet-steps", type=int, default=10, help="steps without commits")
    parser.add_argument("--commit-steps", type=int, default=20, help="steps measured with")
    parser.add_argument("--steady-steps", type=int, default=5, help="steps between faults")
    parser.add_argument("--replicas", type=int, default=1, help="elasticrun's (default 1)")
    parser.add_argument("--wait-s", type=float, default=240.0, help="bound of every wait")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sharded_recovery.json")
    args = parser.parse_args(argv)
    names = [s for s in args.systems.split(",") if s]
    if unknown := set(names) - set(SYSTEMS):
        parser.error(f"unknown systems: {sorted(unknown)}")
    if args.quiet_steps < 3 or args.commit_steps % args.commit_every:
        parser.error("--quiet-steps must be 3 or more, --commit-steps a multiple of --commit-every")
    args.max_s = 20 * args.wait_s  # the workers' safety timer
    rng = random.Random(args.seed)
    logs = args.out.parent / args.out.stem
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    start, load_before, code = time.perf_counter(), os.getloadavg(), git_state()
    with tempfile.TemporaryDirectory(prefix="sharded-recovery-") as tmp, OtherLoad(tmp) as load:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind through cleanup
        for trial in range(args.trials):
            for name in names[trial % len(names) :] + names[: trial % len(names)]:
                t0 = time.perf_counter()
                record = run_trial(name, args, Path(tmp) / f"{name}-{trial}", rng)
                record["trial"], record["wall_s"] = trial, round(time.perf_counter() - t0, 1)
                shutil.copy(Path(tmp) / f"{name}-{trial}.log", logs / f"{name}-{trial}.log")
                records[name].append(record)
                status = "ok" if record["ok"] else f"FAILED ({record['error']})"
                print(f"trial {trial} {name}: {status} in {record['wall_s']} s; "
                      + ", ".join(f"{k} {record[k]}" for k in METRICS if k in record),
                      file=sys.stderr, flush=True)  # fmt: skip
    import torch

    doc: dict[str, Any] = {
        "benchmark": "sharded_recovery",
        "command": command_line("sharded_recovery", argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, shared with other work",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git": code,
        "workload": {
            "model": f"decoder LM, dim {args.dim}, {args.layers} blocks, vocab {args.vocab}",
            "parameters": parameter_count(args.dim, args.layers, args.vocab),
            "optimizer": "Adam",
            "tokens_per_rank_and_step": args.batch * args.seq,
            "ranks": "4 over 2 host names (localhost, 127.0.0.1), 2 each",
            "commit_every_steps": args.commit_every,
            "quiet_steps": args.quiet_steps,
            "commit_steps": args.commit_steps,
            "replicas": args.replicas,
            "elasticrun": "bench/workloads/sharded_elastic.py (ShardedState, commits in memory)",
            "torchrun": "bench/workloads/sharded_torchrun.py (DCP checkpoint to local disk)",
        },
        "notes": [
            "one machine: a lost host is its workers SIGKILLed at once (and, for torchrun, "
            "its agent); their sockets close, so peers learn of it at once",
            "elasticrun goes on with the survivors; torchrun restarts every worker, which "
            "loads the newest DCP checkpoint",
            "torchrun agents: tuned as in bench/recovery.py, their store a process of its own",
            "milestones: seconds from the fault to the first line of each kind after it",
            "elasticrun's workload raises FSDP2's RuntimeError from a step as WorkerLostError "
            "(ShardedState at 0d2ad7c does not; see bench/workloads/sharded_elastic.py)",
        ],
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
        "other_load": load.summary(),
        "systems": {name: summarize_system(records[name]) for name in names},
        "trials": [r for name in names for r in records[name]],
    }
    for name in names:
        doc["systems"][name]["commands"] = next(
            (r["commands"] for r in records[name] if "commands" in r), {}
        )
    doc["targets"] = targets(doc, args.commit_every)
    doc["table"] = markdown(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, default=str)
    args.out.write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
