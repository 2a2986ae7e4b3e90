"""Elastic recovery: elasticrun against torchrun when a worker joins and when one dies.

    python -m bench run recovery --trials 5

Every trial runs the same scenario once per system, the systems interleaved per trial (in a
rotating order) so that machine noise hits them alike:

1. launch 2 workers on two local host names: elasticrun with a discovery file listing
   `localhost:1` and `127.0.0.1:1` (`--min-np 1 --max-np 3 --discovery-interval 0.2
   --failure-scope worker`: the third worker may share its host with the victim);
   torchrun as one agent per simulated node, 2 agents with `--nnodes=1:3 --nproc-per-node=1`
   and a c10d rendezvous on loopback (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: without it,
   torch 2.13's agents re-read stale rendezvous keys after a restart and a new node cannot
   join);
2. once it trains, add a slot: a third host name in the discovery file (this machine's
   hostname when it resolves to a local address, else `localhost:2` in place of
   `localhost:1`), or a third torchrun agent;
3. once it trains at size 3, SIGKILL the worker process of rank 1 (never rank 0, never an
   agent or the driver);
4. once it trains again, SIGTERM every launcher started (by PID), and make sure that no
   process naming the trial's folder is left (a /proc scan; leftovers are SIGKILLed and
   reported).

The workloads (`bench/workloads/`) train the same MLP on the same data, ~20 ms of compute per
step, and print every step of every rank with a `time.time()` stamp; elasticrun's commits in
memory every 5 steps, torchrun's rank 0 checkpoints to a file every 5 steps and every
(re)started worker resumes from that file. Metrics per trial:

* `launch_to_first_step_s`: launch to the first step at size 2;
* `scale_up_s`: discovery change (elasticrun) or third agent's start (torchrun) to the first
  step at size 3;
* `incumbent_stall_s`: the longest gap between consecutive steps of rank 0 or rank 1 from
  their last step before the scale-up to their first step at size 3 (elasticrun's target is
  0.5 s at most); `step_interval_s` is the median gap at size 2, for comparison;
* `scale_up_steps_lost`: last step printed before the first step at size 3 minus the step the
  size-3 job resumes from (torchrun restarts from its checkpoint; elasticrun re-forms at a
  commit);
* `recovery_s`: SIGKILL to the first step completed after it by the re-formed job
  (elasticrun: at size 2; torchrun restarts the whole group, at size 3 again);
* `steps_lost`: last step printed before the SIGKILL minus the step the job resumes from.

`elasticrun_rollback_commit` is elasticrun under `--rollback commit` (back to the last commit
after a death, as Horovod does), beside `elasticrun` (the default, `--rollback step`: back to
no completed step). With `--commit-every 1000` only the initial state is ever committed, so
`steps_lost` shows what each loses to a death when commits are far apart.

`elasticrun_observed` is elasticrun watched as an operator would while it runs: from its
launch on, a thread of the benchmark scrapes `/metrics` once a second and fetches the job's
status once a second with the token (`/v1/status`: the same `JobStatus` the dashboard page
polls every second while it is open), finding the driver through its job file. Side by side
with plain `elasticrun` in the same trials, it shows whether watching a job slows its
recovery; each trial records the requests made, their failures and the slowest answer.

Every wait has a timeout: a trial that hangs is recorded as failed with its reason. The
milestones of each phase (driver log lines, timestamped on arrival, and the workers' own
timestamped events) are reported relative to the trigger, to show where the time goes. Each
trial's full transcript goes to bench/results/elastic_recovery/. The JSON document goes to
stdout and to bench/results/elastic_recovery.json; progress goes to stderr.
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.support.local_systems import (
    COMMIT_EVERY,
    ELASTIC_WORKLOAD,
    TORCHRUN_WORKLOAD,
    TUNED_MONITOR_INTERVAL,
    TUNED_RDZV_CONF,
    System,
    make_systems,
    third_host,
    write_hosts,
)
from bench.support.paths import RESULTS, ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.step_timing import first_step, incumbent_stall, milestones, steady, summarize
from bench.support.trial_processes import (
    Launcher,
    Output,
    TrialFailed,
    free_port,
    stop_all,
)

SYSTEMS = [
    "elasticrun", "elasticrun_rollback_commit", "elasticrun_observed", "torchrun_tuned",
    "torchrun_default",
]  # fmt: skip
WATCH_EVERY = 1.0  # seconds between two scrapes, and between two status fetches

# Timeouts (s) of the waits of one trial.
LAUNCH_TIMEOUT = 90.0  # torchrun's default last call alone is 30 s
STEADY_TIMEOUT = 30.0
SCALE_UP_TIMEOUT = 60.0
RECOVERY_TIMEOUT = 60.0
STEADY_STEPS = 10  # steps to see at a size before acting


# Milestones of each phase: (label, pattern, stamp). "worker" lines carry their own
# time.time() stamp; "arrival" lines (the launchers' logs) are stamped when read here.
SCALE_UP_MILESTONES = {
    "elasticrun": [
        ("driver: hosts available", r"elasticrun: hosts available", "arrival"),
        ("driver: launched joiner", r"elasticrun: launched \d+ worker", "arrival"),
        ("joiner: process up", r"event process up", "worker"),
        ("joiner: python + imports done", r"event started", "worker"),
        ("driver: round at size 3 formed", r"elasticrun: round \d+: 3 worker", "arrival"),
        ("incumbent: entered new epoch", r"event reset size 3", "worker"),
        ("joiner: hvd.init() done (epoch formed)", r"event initialized size 3", "worker"),
        ("joiner: model + optimizer built", r"event ready size 3", "worker"),
        ("state synced, training entered", r"enter \d+ size 3", "worker"),
        ("first step at size 3", r"step \d+ size 3", "worker"),
    ],
    "torchrun": [
        ("agent: new node detected", r"Detected \d+ new nodes", "arrival"),
        ("agents: old group stopped", r"closing signal SIGTERM", "arrival"),
        ("agents: rendezvous complete", r"Rendezvous complete for workers", "arrival"),
        ("new worker: process up", r"event process up", "worker"),
        ("new worker: python + imports done", r"event started", "worker"),
        ("new worker: init_process_group done", r"event initialized size 3", "worker"),
        ("new worker: model + optimizer built", r"event ready size 3", "worker"),
        ("checkpoint loaded, DDP built", r"enter \d+ size 3", "worker"),
        ("first step at size 3", r"step \d+ size 3", "worker"),
    ],
}
RECOVERY_MILESTONES = {
    "elasticrun": [
        ("survivor: collective failed", r"elastic: rank \d+: .*failed", "worker"),
        ("driver: saw the death", r"elasticrun: rank \d+ .*killed by signal", "arrival"),
        ("driver: round at size 2 formed", r"elasticrun: round \d+: 2 worker", "arrival"),
        ("survivor: entered new epoch", r"event reset size 2", "worker"),
        ("state restored+synced, training entered", r"enter \d+ size 2", "worker"),
        ("first step at size 2", r"step \d+ size 2", "worker"),
    ],
    "torchrun": [
        ("agent: saw the death", r"failed \(exitcode: -9\)", "arrival"),
        ("agents: rendezvous complete", r"Rendezvous complete for workers", "arrival"),
        ("new worker: process up", r"event process up", "worker"),
        ("new worker: python + imports done", r"event started", "worker"),
        ("new worker: init_process_group done", r"event initialized", "worker"),
        ("new worker: model + optimizer built", r"event ready", "worker"),
        ("checkpoint loaded, DDP built", r"enter \d+ size", "worker"),
        ("first step after restart", r"step \d+ size", "worker"),
    ],
}
METRICS = [
    "launch_to_first_step_s",
    "scale_up_s",
    "incumbent_stall_s",
    "step_interval_s",
    "scale_up_steps_lost",
    "recovery_s",
    "steps_lost",
]


class Watcher:
    """An operator watching a job: from its job file in `runtime`, every `WATCH_EVERY` s one
    scrape of `/metrics` and one fetch of `/v1/status` with the token, until `stop()`."""

    def __init__(self, runtime: Path) -> None:
        self._runtime = runtime
        self._stopped = threading.Event()
        self.requests = 0
        self.failures = 0
        self.slowest = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import httpx

        from elastic.driver.job_file import find_job

        while not self._stopped.wait(WATCH_EVERY):
            try:
                job = find_job(None, self._runtime / "elasticrun")
            except Exception:  # noqa: BLE001 - not written yet, or the job has ended
                continue
            auth = {"Authorization": f"Bearer {job.token}"}
            for url, headers in ((job.urls.metrics, {}), (f"{job.urls.api}/v1/status", auth)):
                start = time.perf_counter()
                try:
                    ok = httpx.get(url, headers=headers, timeout=10).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.requests += 1
                self.failures += not ok
                self.slowest = max(self.slowest, time.perf_counter() - start)

    def stop(self) -> dict[str, Any]:
        self._stopped.set()
        self._thread.join(15)
        return {"requests": self.requests, "failures": self.failures,
                "slowest_answer_s": round(self.slowest, 4)}  # fmt: skip


def scale_up(
    out: Output, record: dict[str, Any], system: System, t_add: float, launchers: list[Launcher]
) -> None:
    """Wait for the job to train at size 3 after the slot was added at `t_add`; record the
    scale-up metrics and milestones."""
    first3 = out.wait(
        "a step at size 3",
        lambda o: first_step(o.steps, lambda s: s.size == 3 and s.t >= t_add),
        SCALE_UP_TIMEOUT,
        launchers,
    )
    record["scale_up_s"] = first3.t - t_add
    with out.cond:
        before = [s.step for s in out.steps if s.size == 2 and s.t < first3.t]
    record["scale_up_steps_lost"] = max(before) - (first3.step - 1)
    out.wait(
        "steady training at size 3", steady(3, first3, STEADY_STEPS), STEADY_TIMEOUT, launchers
    )
    stall, interval = incumbent_stall(out, t_add)
    record["incumbent_stall_s"], record["step_interval_s"] = stall, interval
    record["scale_up_milestones"] = milestones(out, SCALE_UP_MILESTONES[system.kind], t_add)


def run_trial(system: System, folder: Path, rng: random.Random, add_line: str) -> dict[str, Any]:
    """One scenario of one system; the trial's record (metrics, milestones, errors, stop)."""
    folder.mkdir(parents=True)
    out = Output()
    launchers: list[Launcher] = []
    record: dict[str, Any] = {"system": system.name, "ok": False}
    env = dict(system.env, TMPDIR=str(folder))  # torchrun's temporary folders go in there
    watcher: Watcher | None = None
    if system.observed:
        env["XDG_RUNTIME_DIR"] = str(folder)  # the job file goes in there
        watcher = Watcher(folder)
    t_launch = time.time()
    phase = "launch"
    try:
        # 1. two workers
        if system.kind == "elasticrun":
            hosts = folder / "hosts"
            write_hosts(hosts, ["localhost:1", "127.0.0.1:1"])
            env["ELASTIC_HOSTS_FILE"] = str(hosts)
            cmd = system.elasticrun_cmd(folder)
            launchers.append(Launcher("elasticrun", cmd, env, out, ROOT))
            record["commands"] = {
                "launch": f"OMP_NUM_THREADS=1 ELASTIC_HOSTS_FILE={hosts} {' '.join(cmd)}",
                "hosts file": "localhost:1, 127.0.0.1:1",
                "scale up": f"append {add_line!r} to the hosts file (atomic rename)",
            }
        else:
            port, run_id = free_port(), f"bench-{uuid.uuid4().hex[:8]}"
            cmd = system.torchrun_cmd(folder, port, run_id)
            for k in range(2):
                launchers.append(Launcher(f"agent{k}", cmd, env, out, ROOT))
            record["commands"] = {
                "launch": "OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 LOGLEVEL=INFO "
                + " ".join(cmd)
                + "  (twice: 2 agents)",
                "scale up": "the same command once more (a third agent)",
            }
        first = out.wait(
            "the first step at size 2",
            lambda o: first_step(o.steps, lambda s: s.size == 2),
            LAUNCH_TIMEOUT,
            launchers,
        )
        record["launch_to_first_step_s"] = first.t - t_launch
        phase = "steady at size 2"
        out.wait(
            "steady training at size 2", steady(2, first, STEADY_STEPS), STEADY_TIMEOUT, launchers
        )

        # 2. add a slot
        phase = "scale up"
        t_add = time.time()
        record["scale_up_at_s"] = round(t_add - t_launch, 3)  # in the trial's transcript
        if system.kind == "elasticrun":
            write_hosts(hosts, ["localhost:1", "127.0.0.1:1", add_line])
        else:
            launchers.append(Launcher("agent2", cmd, env, out, ROOT))
        try:
            scale_up(out, record, system, t_add, launchers)
            size = 3
        except TrialFailed as err:  # recorded; the recovery is still measured if it trains
            record["scale_up_error"] = str(err)
            phase = "after the failed scale up"
            t_check = time.time()
            latest = out.wait(
                "training to go on",
                lambda o: first_step(o.steps, lambda s: s.t > t_check),
                STEADY_TIMEOUT,
                launchers,
            )
            size = latest.size

        # 3. SIGKILL rank 1's worker, at a random point between commits
        phase = "recovery"
        time.sleep(rng.uniform(0.0, 0.3))
        with out.cond:
            victim = next(s for s in reversed(out.steps) if s.size == size and s.rank == 1)
            known = {s.pid for s in out.steps}
            t_kill = time.time()
            os.kill(victim.pid, signal.SIGKILL)
        record["kill_at_s"] = round(t_kill - t_launch, 3)
        record["killed_at_size"] = size
        if system.kind == "elasticrun":
            resumed = lambda s: s.size == size - 1 and s.t > t_kill  # noqa: E731
        else:  # torchrun restarts the whole group: the first step of a new process
            resumed = lambda s: s.pid not in known and s.t > t_kill  # noqa: E731
        back = out.wait(
            "a step after the SIGKILL",
            lambda o: first_step(o.steps, resumed),
            RECOVERY_TIMEOUT,
            launchers,
        )
        record["recovery_s"] = back.t - t_kill
        record["recovered_size"] = back.size
        with out.cond:
            last = max(s.step for s in out.steps if s.t <= t_kill)
        record["last_step_before_kill"], record["resumed_from_step"] = last, back.step - 1
        record["steps_lost"] = last - (back.step - 1)
        old = known if system.kind == "torchrun" else set()
        record["recovery_milestones"] = milestones(
            out, RECOVERY_MILESTONES[system.kind], t_kill, old
        )
        record["ok"] = "scale_up_error" not in record
    except Exception as err:  # noqa: BLE001 - any failure fails this trial, not the benchmark
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{phase}: {detail}"
    finally:
        if watcher is not None:
            record["watched"] = watcher.stop()
        record["stop"] = stop_all(launchers, str(folder))
        (folder.parent / f"{folder.name}.log").write_text(out.transcript(t_launch) + "\n")
    for key in METRICS:
        if isinstance(record.get(key), float):
            record[key] = round(record[key], 3)
    return record


# --- the benchmark --------------------------------------------------------------------------


def summarize_system(records: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if r["ok"]]
    metrics = {}
    for key in METRICS:
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            metrics[key] = summarize(values)
    phases: dict[str, dict[str, Any]] = {}
    for phase in ("scale_up_milestones", "recovery_milestones"):
        phases[phase] = {}
        for label in next((list(r[phase]) for r in records if phase in r), []):
            values = [r[phase][label] for r in records if r.get(phase, {}).get(label) is not None]
            if values:
                phases[phase][label] = summarize(values)
    return {
        "trials": len(records),
        "trials_ok": len(ok),
        "metrics": metrics,
        **phases,
        "failures": [
            f"trial {r.get('trial')}: {r[key]}"
            for r in records
            for key in ("scale_up_error", "error")
            if key in r
        ],
        "leftovers": sum(len(r["stop"]["leftover_processes_sigkilled"]) for r in records),
        **_watched(records),
    }


def _watched(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The watching's totals over the trials of an observed system (nothing for others)."""
    watched = [r["watched"] for r in records if "watched" in r]
    if not watched:
        return {}
    return {
        "watched": {
            "requests": sum(w["requests"] for w in watched),
            "failures": sum(w["failures"] for w in watched),
            "slowest_answer_s": max(w["slowest_answer_s"] for w in watched),
        }
    }


def markdown(doc: dict[str, Any]) -> str:
    systems = [s for s in SYSTEMS if s in doc["systems"]]
    rows = ["| metric | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for key in METRICS:
        cells = []
        for name in systems:
            m = doc["systems"][name]["metrics"].get(key)
            cells.append(f"{m['median']:g} [{m['min']:g}–{m['max']:g}]" if m else "—")
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    trials = [f"{doc['systems'][s]['trials_ok']}/{doc['systems'][s]['trials']}" for s in systems]
    rows.append("| trials ok | " + " | ".join(trials) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--default-trials",
        type=int,
        default=None,
        help="trials of torchrun with its default timeouts (default: --trials); each takes "
        "~55 s on 2 CPUs, its launch waiting out the rendezvous' default 30 s last call",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--commit-every",
        type=int,
        default=COMMIT_EVERY,
        help=f"steps between two commits or checkpoints (default {COMMIT_EVERY}); 1000: only "
        "the initial state is ever committed, so a rollback shows in steps_lost",
    )
    args = parser.parse_args(argv)
    names = [s for s in args.systems.split(",") if s]
    if unknown := set(names) - set(SYSTEMS):
        parser.error(f"unknown systems: {sorted(unknown)}")
    default_trials = args.trials if args.default_trials is None else args.default_trials
    systems = make_systems(args.commit_every)
    add_line, add_why = third_host()
    rng = random.Random(args.seed)
    logs = RESULTS / "elastic_recovery"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    start = time.perf_counter()
    load_before = os.getloadavg()
    code = git_state()  # at the start: what the trials run
    with tempfile.TemporaryDirectory(prefix="elastic-recovery-") as tmp:
        # A SIGTERM to the benchmark unwinds through the trials' cleanup like a Ctrl-C.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        for trial in range(args.trials):
            order = names[trial % len(names) :] + names[: trial % len(names)]
            for name in order:
                if name == "torchrun_default" and trial >= default_trials:
                    continue
                t0 = time.perf_counter()
                record = run_trial(systems[name], Path(tmp) / f"{name}-{trial}", rng, add_line)
                record["trial"] = trial
                record["wall_s"] = round(time.perf_counter() - t0, 1)
                shutil.copy(Path(tmp) / f"{name}-{trial}.log", logs / f"{name}-{trial}.log")
                records[name].append(record)
                status = "ok" if record["ok"] else f"FAILED ({record['error']})"
                print(
                    f"trial {trial} {name}: {status} in {record['wall_s']} s; "
                    + ", ".join(f"{k} {record[k]}" for k in METRICS if k in record),
                    file=sys.stderr,
                    flush=True,
                )
    import torch

    doc: dict[str, Any] = {
        "benchmark": "elastic_recovery",
        "command": command_line("recovery", argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "workload": {
            "model": "MLP 64-768-768-768-1, SGD, 80 samples per rank and step, 1 thread",
            "commit_every_steps": args.commit_every,
            "elasticrun": str(ELASTIC_WORKLOAD.relative_to(ROOT)),
            "torchrun": str(TORCHRUN_WORKLOAD.relative_to(ROOT)),
        },
        "scale_up_host": {"line": add_line, "why": add_why},
        "torchrun_tuned": {
            "rdzv_conf": TUNED_RDZV_CONF,
            "monitor_interval": TUNED_MONITOR_INTERVAL,
        },
        "notes": [
            f"torchrun_default ran {min(default_trials, args.trials)} trial(s), the others "
            f"{args.trials}; its launch waits out the c10d rendezvous' default 30 s last call",
            "recovery: elasticrun goes on at size 2 in the surviving processes (the dead "
            "worker's host is in cooldown); torchrun's agent restarts every worker and the job "
            "goes on at size 3 from rank 0's last checkpoint",
            "torchrun agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: without it a third "
            "agent's join fails the scale-up (seen here: the agents hang, ignoring SIGTERM for "
            "15 s, or exit with code 1)",
            "milestones: seconds from the trigger (discovery change / third agent / SIGKILL) "
            "to the first line of each kind after it; driver and agent lines are stamped on "
            "arrival here, worker lines carry their own time.time()",
        ],
        "systems": {},
        "trials": [],
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    for name in names:
        summary = summarize_system(records[name])
        summary["commands"] = next((r["commands"] for r in records[name] if "commands" in r), {})
        doc["systems"][name] = summary
        doc["trials"] += records[name]
    doc["table"] = markdown(doc)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2)
    (RESULTS / "elastic_recovery.json").write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
