"""Goodput on a real spot trace: elasticrun (with and without preemption notices) against
torchrun on the multi-host bed, every system replaying the same hosts appearing and
vanishing at the same moments.

    python -m bench run goodput [--window 0:4] [--hour-s 60] [--hosts 8] [--notice-lead-min 2]

As root (the bed's network namespaces); about 5 minutes per system with the defaults
(a 240 s replay, plus the bed and the launch).

The trace (bench/support/spot_trace.py): `aws_p3_spot_availability.csv` beside the project
(../shared/data/traces; from the Parcae paper, NSDI'24: up to 32 AWS p3.2xlarge spot nodes
over 11.4 hours). `--window FROM:TO` trace hours are replayed with one trace hour in
`--hour-s` seconds, and 32 nodes scaled to `--hosts` bed hosts (1 slot each; 32 -> 8: four
nodes a host, rounded). A reclaim is the host's power going (`Bed.vanish`: no FIN, no RST);
an allocation is the host back (`Bed.back`, sshd answering), which elasticrun learns from its
discovery file and torchrun from a new agent started on it, as a machine's service manager
would. The systems:

* `elasticrun`: with notices: `--notice-lead-min` trace minutes before each reclaim (AWS
  gives 2), the host's discovery line says `leaving=T`, so its worker leaves at a step
  boundary; durable commits (`--checkpoint-dir`, every `--checkpoint-every`-th commit);
* `elasticrun_no_notice`: the same without notices: each reclaim is a host lost mid-step,
  the survivors roll back to their last in-memory commit;
* `torchrun`: as tuned in bench/host_faults.py (`bench/support/bed_systems.py`) but with the store's
  default read timeout (`RDZV`); rank 0 checkpoints every `--commit-every` steps to the same
  disk; every change restarts every worker from it.

Both workloads train the same tiny MLP (bench/workloads/), committing (elasticrun, in memory)
or checkpointing (torchrun) every `--commit-every` steps, each step first waiting
`--compute-s` seconds as if an accelerator computed: so that up to 8 hosts sharing this
machine's 2 CPUs still each train about as fast as alone. The replay starts once the job
trains steadily at the window's first size.

Measured (bench/support/goodput_ledger.py): rank 0's step lines give the useful rank-steps
(a step at size N counts N; a step redone after a rollback counts once); the ideal is what every
offered host would have trained at the fastest steady step time measured at its size; goodput is
their ratio, and what was lost is split by cause (re-forms and restarts, rollbacks, hosts left on
notice, hosts not yet in the job, slower steps, the unfinished last step). A job whose launchers all
exited during the replay is measured as it went (`job_ended` says so).

The JSON document goes to stdout and to `--out` (default bench/results/goodput.json), each
run's transcript beside it (bench/results/goodput/); progress to stderr. After each run every
launcher is stopped and the bed closed; leftovers are SIGKILLed and reported, as in
bench/host_faults.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.support.bed_systems import ElasticrunOnBed, TorchrunOnBed, clean_up, leftovers
from bench.support.goodput_ledger import (
    CAUSES,
    StepLine,
    account,
    ideal_step_times,
    step_times,
)
from bench.support.paths import ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.spot_trace import AWS_P3_TRACE, Replay, TraceError, read_trace, scale, schedule
from bench.support.step_timing import first_step, steady
from bench.support.trial_processes import Output, TrialFailed
from tests.multihost.bed import Bed, BedUnavailable, missing_prerequisite

SYSTEMS = ["elasticrun", "elasticrun_no_notice", "torchrun"]
TARGETS = {"goodput_at_least": 0.90, "over_torchrun_at_least": 1.5}
LAUNCH_TIMEOUT = 120.0
STEADY_STEPS = 10
PROGRESS_EVERY = 30.0  # s of replay between progress lines
# torchrun's store on the root namespace, as in bench.host_faults, but with the default
# read_timeout (60 s): with bench.host_faults's 5 s (for a partition, which never happens here),
# an agent whose rank assignment took over 5 s while 8 hosts shared 2 CPUs failed, and with it
# the whole rendezvous (closed: every later agent exits at once).
RDZV = "is_host=false"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=AWS_P3_TRACE, help="the trace CSV")
    parser.add_argument(
        "--window", default="0:4", help="trace hours FROM:TO to replay (default 0:4)"
    )
    parser.add_argument(
        "--hour-s", type=float, default=60.0, help="replay seconds per trace hour (default 60)"
    )
    parser.add_argument("--hosts", type=int, default=8, help="bed hosts for the trace's 32 nodes")
    parser.add_argument(
        "--notice-lead-min",
        type=float,
        default=2.0,
        help="trace minutes from a notice to its reclaim (default 2, AWS's)",
    )
    parser.add_argument("--commit-every", type=int, default=10, help="steps (default 10)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        help="elasticrun writes every N-th commit to disk (default 5)",
    )
    parser.add_argument("--compute-s", type=float, default=0.1, help="per step (default 0.1)")
    parser.add_argument(
        "--torchrun-pg-timeout", type=float, default=5.0, help="as in bench.host_faults (s)"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0, help="which hosts are reclaimed")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "goodput.json", help="JSON"
    )
    args = parser.parse_args(argv)
    try:
        low, high = (float(x) for x in args.window.split(":"))
    except ValueError:
        parser.error(f"--window: expected FROM:TO trace hours, got {args.window!r}")
    args.window = (low, high)
    args.systems = [s for s in args.systems.split(",") if s]
    if unknown := set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(unknown)} (known: {', '.join(SYSTEMS)})")
    for flag in ("hour_s", "compute_s", "notice_lead_min"):
        if getattr(args, flag) < 0 or (flag == "hour_s" and args.hour_s == 0):
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    if args.hosts < 2 or args.commit_every < 1 or args.checkpoint_every < 1:
        parser.error("--hosts must be 2 or more; --commit-every, --checkpoint-every 1 or more")
    return args


def make_job(
    system: str, bed: Bed, folder: Path, out: Output, args: argparse.Namespace, replay: Replay
) -> ElasticrunOnBed | TorchrunOnBed:
    workload = [
        "--commit-every", str(args.commit_every), "--compute-s", str(args.compute_s),
        "--max-seconds", str(replay.duration + LAUNCH_TIMEOUT + 120),
    ]  # fmt: skip
    if system == "torchrun":
        return TorchrunOnBed(
            bed, folder, out, args, hosts=replay.start, workload=workload, rdzv_on_bed=RDZV
        )
    flags = ["--checkpoint-dir", str(folder / "durable")]
    flags += ["--checkpoint-every", str(args.checkpoint_every)]
    return ElasticrunOnBed(
        bed, folder, out, args, hosts=replay.start, flags=flags, workload=workload
    )


def actions(replay: Replay, lead_s: float | None) -> list[tuple[float, str, str, float]]:
    """(at, what, host, reclaim time) in replay seconds, in order: every change, and with
    `lead_s` a notice that long before each reclaim (at 0 at the earliest)."""
    planned = [(c.at, c.kind, c.host, c.at) for c in replay.changes]
    if lead_s is not None:
        planned += [
            (max(0.0, c.at - lead_s), "notice", c.host, c.at)
            for c in replay.changes
            if c.kind == "reclaim"
        ]
    order = {"notice": 0, "reclaim": 1, "allocate": 2}
    return sorted(planned, key=lambda a: (a[0], order[a[1]]))


def carry_out(
    bed: Bed, job: ElasticrunOnBed | TorchrunOnBed, planned: list, t0: float, out: Output
) -> list[dict[str, Any]]:
    """Carry out the `planned` actions at their times after `t0`; what was done, when."""
    done = []
    index = 0
    next_progress = PROGRESS_EVERY
    while index < len(planned):
        at = planned[index][0]
        burst = [a for a in planned[index:] if a[0] == at]
        index += len(burst)
        while (wait := t0 + at - time.time()) > 0:
            time.sleep(min(wait, 1.0))
            if time.time() - t0 >= next_progress:
                progress(out, t0, time.time() - t0)
                next_progress += PROGRESS_EVERY
        started = time.time()
        reclaimed = [host for _, what, host, _ in burst if what == "reclaim"]
        for _, what, host, reclaim_at in burst:
            if what == "notice":
                job.host_noticed(host, t0 + reclaim_at)
        if reclaimed:
            bed.vanish_together(reclaimed)
            for host in reclaimed:
                job.host_gone(host)
        for _, what, host, _ in burst:
            if what == "allocate":
                bed.back(host)
                job.host_returned(host)
        for _, what, host, _ in burst:
            done.append(
                {
                    "at": round(at, 3),
                    "what": what,
                    "host": host,
                    "late_s": round(started - t0 - at, 3),
                    "took_s": round(time.time() - started, 3),
                }
            )
    return done


def progress(out: Output, t0: float, elapsed: float) -> None:
    with out.cond:
        last = next((s for s in reversed(out.steps) if s.rank == 0), None)
    where = f"step {last.step} at size {last.size}" if last else "no step yet"
    print(f"  replay {elapsed:.0f} s: {where}", file=sys.stderr, flush=True)


def run_replay(
    system: str, replay: Replay, folder: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One system's replay on a fresh bed: its record, with rank 0's step lines in replay
    seconds (`steps`) for the ledger."""
    folder.mkdir(parents=True)
    out = Output()
    record: dict[str, Any] = {"system": system, "ok": False}
    bed: Bed | None = None
    job: ElasticrunOnBed | TorchrunOnBed | None = None
    t_start = time.time()
    phase = "bed"
    t0 = None
    try:
        bed = Bed(args.hosts, folder.parent / "beds" / folder.name)
        for host in bed.hosts:
            if host.name not in replay.start:
                bed.vanish(host.name)
        phase = "launch"
        job = make_job(system, bed, folder, out, args, replay)
        job.start()
        record["commands"] = job.commands
        size = len(replay.start)
        first = out.wait(
            f"the first step at size {size}",
            lambda o: first_step(o.steps, lambda s: s.size == size),
            LAUNCH_TIMEOUT,
            job.agents,
        )
        out.wait("steady training", steady(size, first, STEADY_STEPS), LAUNCH_TIMEOUT, job.agents)
        record["launch_s"] = round(time.time() - t_start, 3)
        phase = "replay"
        t0 = time.time()
        lead = args.notice_lead_min * args.hour_s / 60 if system == "elasticrun" else None
        planned = actions(replay, lead)
        record["actions"] = carry_out(bed, job, planned, t0, out)
        time.sleep(max(0.0, t0 + replay.duration - time.time()))
        if all(a.process.poll() is not None for a in job.agents):  # measured all the same
            codes = [a.process.returncode for a in job.agents]
            record["job_ended"] = f"every launcher exited during the replay, codes {codes}"
        record["notices"] = [(a[0], a[3]) for a in planned if a[1] == "notice"]
        record["ok"] = True
    except Exception as err:  # noqa: BLE001 - any failure fails this run, not the benchmark
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{phase}: {detail}"
    finally:
        record["stop"] = clean_up(folder, bed, job, None)
        (folder.parent / f"{folder.name}.log").write_text(out.transcript(t_start) + "\n")
    with out.cond:
        record["steps"] = [
            StepLine(round(s.t - t0, 6), s.step, s.size, s.pid)
            for s in out.steps
            if s.rank == 0 and t0 is not None
        ]
    record["wall_s"] = round(time.time() - t_start, 1)
    return record


def ledgers(records: list[dict[str, Any]], replay: Replay, hosts: int) -> dict[str, Any]:
    """The ideal step times and each system's ledger (rank-steps and shares of the ideal)."""
    ok = [r for r in records if r["ok"]]
    measured = {r["system"]: step_times(r["steps"]) for r in ok}
    ideal = ideal_step_times(list(measured.values()), range(1, hosts + 1))
    capacity = sum(
        count * (end - at)
        for (at, count), end in zip(
            replay.counts, [*(at for at, _ in replay.counts[1:]), replay.duration], strict=True
        )
    )
    systems = {}
    for record in ok:
        ledger = account(
            record["steps"],
            duration=replay.duration,
            alive=replay.alive,
            changes_at=[at for at, _ in replay.counts],
            step_time=ideal,
            notices=record.get("notices", []),
        )
        share = {cause: ledger.losses[cause] / ledger.ideal for cause in CAUSES}
        systems[record["system"]] = {
            "goodput": round(ledger.goodput, 4),
            "useful_rank_steps": ledger.useful,
            "ideal_rank_steps": round(ledger.ideal, 1),
            "rolled_back_rank_steps": ledger.done - ledger.useful,
            "lost_share_of_ideal": {k: round(v, 4) for k, v in share.items()},
            "lost_host_s": {k: round(v * capacity, 1) for k, v in share.items()},
            "job_ended": record.get("job_ended"),
            "step_time_s": {
                str(k): round(v, 4) for k, v in sorted(measured[record["system"]].items())
            },
        }
    return {
        "capacity_host_s": round(capacity, 1),
        "ideal_step_time_s": {str(k): round(v, 4) for k, v in ideal.items()},
        "systems": systems,
    }


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    systems = result["systems"]
    mine = systems.get("elasticrun", {}).get("goodput")
    theirs = systems.get("torchrun", {}).get("goodput")
    over = round(mine / theirs, 2) if mine is not None and theirs else None
    return {
        "elasticrun_goodput": mine,
        "elasticrun_over_torchrun": over,
        "goodput_met": mine is not None and mine >= TARGETS["goodput_at_least"],
        "over_torchrun_met": over is not None and over >= TARGETS["over_torchrun_at_least"],
    }


def markdown(result: dict[str, Any], systems: list[str]) -> str:
    rows = ["| | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
    cells = [result["systems"].get(s) for s in systems]

    def goodput(cell: dict[str, Any] | None) -> str:
        if cell is None:
            return "failed"
        return f"{cell['goodput']:.1%}" + (" (the job died)" if cell["job_ended"] else "")

    rows.append("| goodput | " + " | ".join(goodput(c) for c in cells) + " |")
    for cause in CAUSES:
        shares = [f"{c['lost_share_of_ideal'][cause]:.1%}" if c else "" for c in cells]
        rows.append(f"| lost: {cause} | " + " | ".join(shares) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    args = parse_args(argv)
    if reason := missing_prerequisite():
        sys.exit(f"goodput: no bed on this machine: {reason}")
    try:
        counts, duration = scale(
            read_trace(args.trace), hosts=args.hosts, hour_s=args.hour_s, window_h=args.window
        )
    except TraceError as err:
        sys.exit(f"goodput: {err}")
    names = [f"h{i}" for i in range(1, args.hosts + 1)]
    replay = schedule(counts, duration, names, args.seed)
    try:
        Bed(1).close()  # fail early, in one line, where the kernel refuses a bed
    except BedUnavailable as err:
        sys.exit(f"goodput: no bed on this machine: {err}")
    logs = args.out.with_suffix("")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    print(
        f"goodput: trace hours {args.window[0]:g}-{args.window[1]:g} in {duration:.0f} s, "
        f"{len(replay.changes)} host changes, {len(replay.start)} hosts at the start",
        file=sys.stderr,
        flush=True,
    )
    records = []
    start = time.perf_counter()
    load_before = os.getloadavg()
    code = git_state()
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        for system in args.systems:
            print(f"{system}: replaying", file=sys.stderr, flush=True)
            record = run_replay(system, replay, Path(tmp) / system, args)
            shutil.copy(Path(tmp) / f"{system}.log", logs / f"{system}.log")
            records.append(record)
            status = "ok" if record["ok"] else f"FAILED ({record['error']})"
            if "job_ended" in record:
                status += f", but the job ended: {record['job_ended']}"
            print(
                f"{system}: {status} in {record['wall_s']} s; leftovers {leftovers(record)}",
                file=sys.stderr,
                flush=True,
            )
    import torch

    result = (
        ledgers(records, replay, args.hosts) if any(r["ok"] for r in records) else {"systems": {}}
    )
    for record in records:  # the step lines are in the transcripts; keep the JSON readable
        record["steps"] = len(record["steps"])
    doc: dict[str, Any] = {
        "benchmark": "goodput",
        "command": command_line("goodput", argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "trace": {
            "file": str(args.trace),
            "window_trace_h": list(args.window),
            "time_scale": f"1 trace hour = {args.hour_s:g} s of replay",
            "node_scale": f"32 nodes = {args.hosts} hosts (1 slot each), rounded, at least 1",
            "replay_s": round(duration, 1),
            "notice_lead": f"{args.notice_lead_min:g} trace min = "
            f"{args.notice_lead_min * args.hour_s / 60:g} s of replay",
            "hosts_at_start": list(replay.start),
            "changes": [vars(c) for c in replay.changes],
            "counts": [list(c) for c in replay.counts],
        },
        "workload": {
            "model": "MLP 64-768-768-768-1, SGD, 80 samples per rank and step, 1 thread",
            "compute_s_per_step": args.compute_s,
            "commit_every_steps": args.commit_every,
            "elasticrun_checkpoint_every_commits": args.checkpoint_every,
            "torchrun_checkpoint_every_steps": args.commit_every,
        },
        "systems_run": args.systems,
        "runs": records,
        **result,
        "targets": TARGETS,
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    doc["verdict"] = verdict(doc)
    doc["table"] = markdown(doc, args.systems)
    text = json.dumps(doc, indent=2, default=str)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
