"""A job under abuse: does anything outside the job stall its driver?

    python -m bench run abuse                      (60 s of abuse, 2,000 silent connections a port)
    python -m bench run abuse --seconds 15 --silent 500 --slow-bodies 100

The same 3-worker job runs twice, one phase after the other: undisturbed, then abused. A phase
launches `elasticrun -np 3 --min-np 2 -H localhost:1,127.0.0.1:1,HOSTNAME:1` (three names of
this machine, so that the killed worker is alone on its host; `-H localhost:2,127.0.0.1:1` where
the hostname is no local name; `--start-timeout 120` for a loaded machine) with the
recovery benchmarks' workload (`bench/workloads/tiny_elastic.py`, a step of ~20 ms of compute
after a 50 ms sleep, so that three workers leave this machine's CPUs to the driver and the
hostile clients; commits every 5 steps; the cooldown is 600 s so that the killed slot is not
refilled during the phase), waits for steady training, watches the driver for 2 s at rest, then
for `--seconds`:

* (abused phase only, each hostile client in a process of its own, `bench/support/abuse_probes.py`)
  (a) one connection floods the heartbeat port with junk frames at full speed, reopened when
  closed; (b) `--silent` silent connections are held on each of the HTTP, gRPC and heartbeat
  ports; (c) `--slow-bodies` unauthenticated `POST /ui/login` bodies trickle in a byte per
  connection a second, reopened when closed. They connect from `--sources` loopback addresses
  other than the workers' (127.0.0.2, ...), as hostile peers elsewhere would;
* the driver's resident memory (VmRSS) and descriptor count are sampled every 0.15 s, and
  `/v1/status` with the job's token is asked every 0.5 s on a fresh connection
  (`bench/support/driver_watch.py`);
* at half time, one worker (rank 2, alone on its host) is SIGKILLed; its recovery is the time
  from the kill to the first step of the re-formed round at size 2 (as
  bench/recovery.py measures it).

Reported per phase over the abuse window: the longest gap between two steps of one worker in
the same round (a re-form's gap is the recovery, reported apart), the peak RSS and descriptor
count, the status latency (median, p99, max, failures, the slowest five and when they were
asked), the recovery time and the lines the driver logged; for the abused phase, what each
hostile client did. Targets (the issue's): no step gap over 0.5 s, peak RSS less than 100 MiB
over the undisturbed phase's, every status answered within 1 s, recovery within twice the
undisturbed one. One JSON document on stdout and in `--out` (default bench/results/abuse.json),
with each target's pass or fail; each phase's transcript goes to bench/results/abuse/. A
driver whose RSS grows `--rss-safety-mib` past its size at rest has its hostile clients killed
at once (recorded as `safety_stop`): a shared machine's memory is not the benchmark's to
exhaust.
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
import time
from pathlib import Path
from typing import Any

from bench.support.abuse_probes import Hostile, driver_ports, raise_open_file_limit, start_abuse
from bench.support.driver_watch import DriverWatch, StatusPoller, open_file_limit, resident_mib
from bench.support.local_systems import ELASTIC_WORKLOAD, make_systems, third_host
from bench.support.machine_load import OtherLoad
from bench.support.paths import RESULTS, ROOT
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.step_timing import first_step, steady
from bench.support.trial_processes import Launcher, Output, Step, TrialFailed, stop_all
from elastic.driver.job_file import find_job

WORKER_LINE = re.compile(r"^\[\d+\]<std(out|err)>:")  # the launcher's copy of a worker's line

WORKERS = 3
COMPUTE_S = 0.05  # each step's sleep before its ~20 ms of compute
COMMIT_EVERY = 5
AT_REST_S = 2.0  # the driver watched before the abuse
KILL_AT = 0.5  # of the abuse window
LAUNCH_TIMEOUT = 120.0
STEADY_TIMEOUT = 60.0
RECOVERY_TIMEOUT = 60.0
STEADY_STEPS = 10

TARGETS = {
    "step_gap_s": "abused: at most 0.5 s",
    "peak_rss_over_undisturbed_mib": "less than 100 MiB",
    "status_max_s": "abused: every request answered, within 1 s",
    "recovery_s": "abused: at most twice the undisturbed",
}


def hosts() -> str:
    """Three slots on this machine, the last alone on its host name (the SIGKILL's victim)."""
    third, _ = third_host()
    if third.startswith("localhost:"):
        return "localhost:2,127.0.0.1:1"
    return f"localhost:1,127.0.0.1:1,{third}"


def elasticrun_cmd(folder: Path, seconds: float) -> list[str]:
    exe = shutil.which("elasticrun")
    return [
        *([exe] if exe else [sys.executable, "-m", "elastic.driver.cli"]),
        "-np", str(WORKERS), "--min-np", str(WORKERS - 1), "--max-np", str(WORKERS),
        "-H", hosts(), "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
        sys.executable, str(ELASTIC_WORKLOAD), "--out", str(folder),
        "--commit-every", str(COMMIT_EVERY), "--compute-s", str(COMPUTE_S),
        "--max-seconds", str(seconds + 300),
    ]  # fmt: skip


def step_gaps(steps: list[Step], start: float, end: float) -> dict[str, float | None]:
    """The longest gap between consecutive steps of one worker (by pid) within [start, end]
    when both are in a round of the same size (`step_gap_s`), and the longest across a change
    of size (`reform_gap_s`: a recovery)."""
    same: list[float] = []
    across: list[float] = []
    for pid in {s.pid for s in steps}:
        mine = sorted((s for s in steps if s.pid == pid and start <= s.t <= end), key=lambda s: s.t)
        for a, b in zip(mine, mine[1:], strict=False):
            (same if a.size == b.size else across).append(b.t - a.t)
    return {
        "step_gap_s": round(max(same), 3) if same else None,
        "reform_gap_s": round(max(across), 3) if across else None,
        "steps_in_window": sum(1 for s in steps if start <= s.t <= end),
    }


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def run_phase(name: str, folder: Path, args: argparse.Namespace, abuse: bool) -> dict[str, Any]:
    """One phase (see the module's docstring); its record, with `error` when it failed."""
    folder.mkdir(parents=True)
    out = Output()
    launchers: list[Launcher] = []
    hostiles: list[Hostile] = []
    record: dict[str, Any] = {"phase": name, "ok": False}
    env = dict(make_systems()["elasticrun"].env, XDG_RUNTIME_DIR=str(folder))
    watch: DriverWatch | None = None
    poller: StatusPoller | None = None
    t_launch = time.time()
    t_start = t_end = t_launch
    step = "launch"

    def safety_stop(rss: float) -> None:
        for hostile in hostiles:
            hostile.kill()
        record["safety_stop"] = {"at_s": round(time.time() - t_start, 2), "rss_mib": round(rss)}

    load = OtherLoad(str(folder))
    try:
        with load:
            launchers.append(
                Launcher("elasticrun", elasticrun_cmd(folder, args.seconds), env, out, ROOT)
            )
            load.own.add(launchers[0].process.pid)
            first = out.wait(
                "the first step at size 3",
                lambda o: first_step(o.steps, lambda s: s.size == WORKERS),
                LAUNCH_TIMEOUT,
                launchers,
            )
            out.wait(
                "steady training", steady(WORKERS, first, STEADY_STEPS), STEADY_TIMEOUT, launchers
            )
            step = "finding the driver"
            job = find_job(None, folder / "elasticrun")
            pid = launchers[0].process.pid
            if job.pid != pid:
                raise TrialFailed(f"the job file names pid {job.pid}, the launcher is {pid}")
            ports = driver_ports(pid, job.urls.api)
            record["ports"] = {"http": ports.http, "grpc": ports.grpc, "beats": ports.beats}
            at_rest = resident_mib(pid) or 0.0
            watch = DriverWatch(pid, rss_cap_mib=at_rest + args.rss_safety_mib, on_cap=safety_stop)
            poller = StatusPoller(ports.host, ports.http, job.token)
            time.sleep(AT_REST_S)
            t_start = time.time()
            mark = load.mark()
            step = "abuse" if abuse else "watching"
            if abuse:
                hostiles += start_abuse(
                    ports, args.seconds, args.silent, args.slow_bodies, args.sources
                )
                load.own.update(h.process.pid for h in hostiles)
            sleep_until(t_start + KILL_AT * args.seconds)
            step = "recovery"
            with out.cond:
                victim = next(
                    s for s in reversed(out.steps) if s.size == WORKERS and s.rank == WORKERS - 1
                )
                t_kill = time.time()
                os.kill(victim.pid, signal.SIGKILL)
            back = out.wait(
                "a step after the SIGKILL",
                lambda o: first_step(o.steps, lambda s: s.size == WORKERS - 1 and s.t > t_kill),
                RECOVERY_TIMEOUT,
                launchers,
            )
            record["kill_at_s"] = round(t_kill - t_start, 2)
            record["recovery_s"] = round(back.t - t_kill, 3)
            step = "abuse after the recovery" if abuse else "watching after the recovery"
            sleep_until(t_start + args.seconds)
            t_end = time.time()
            record["other_processes_cpu_pct"] = load.mean_since(mark)
            record["ok"] = "safety_stop" not in record
    except Exception as err:  # noqa: BLE001 - a failed phase is recorded, not raised
        t_end = t_end if t_end > t_start else time.time()
        detail = str(err) if isinstance(err, TrialFailed) else f"{type(err).__name__}: {err}"
        record["error"] = f"{step}: {detail}"
    finally:
        if hostiles:
            record["hostile"] = [
                h.result(timeout=max(5.0, t_start + args.seconds + 15 - time.time()))
                for h in hostiles
            ]
        if poller is not None:
            poller.stop()
            record["status"] = poller.window(t_start, t_end)
        if watch is not None:
            watch.stop()
            record["driver"] = {
                "at_rest": watch.window(t_start - AT_REST_S, t_start),
                "window": watch.window(t_start, t_end),
                "open_file_limit": open_file_limit(watch.pid),
            }
        with out.cond:
            steps = list(out.steps)
            logged = [x.text for x in out.lines if t_start <= x.arrived <= t_end + 1.0]
        record.update(step_gaps(steps, t_start, t_end))
        driver = [text for text in logged if not WORKER_LINE.match(text)]
        record["driver_log_lines"] = {"count": len(driver), "first": driver[:5]}
        record["window_s"] = round(t_end - t_start, 2)
        record["stop"] = stop_all(launchers, str(folder))
        transcripts = RESULTS / "abuse"
        transcripts.mkdir(parents=True, exist_ok=True)
        (transcripts / f"{name}.log").write_text(out.transcript(t_launch) + "\n")
    return record


def _get(record: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(record, dict) or key not in record:
            return None
        record = record[key]
    return record


def judge(calm: dict[str, Any], abused: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target's values and whether the abused phase met it (a missing value fails)."""
    gap = abused.get("step_gap_s")
    rss = [_get(r, "driver", "window", "peak_rss_mib") for r in (calm, abused)]
    over = round(rss[1] - rss[0], 1) if None not in rss else None
    status = abused.get("status", {})
    recovery = [r.get("recovery_s") for r in (calm, abused)]
    return {
        "step_gap_s": {
            "undisturbed": calm.get("step_gap_s"), "abused": gap,
            "pass": gap is not None and gap <= 0.5,
        },
        "peak_rss_over_undisturbed_mib": {
            "undisturbed": rss[0], "abused": rss[1], "over": over,
            "pass": over is not None and over < 100,
        },
        "status_max_s": {
            "undisturbed": _get(calm, "status", "max_s"), "abused": status.get("max_s"),
            "abused_failures": status.get("failures"),
            "pass": bool(status.get("requests")) and status.get("failures") == 0
            and status["max_s"] <= 1.0,
        },
        "recovery_s": {
            "undisturbed": recovery[0], "abused": recovery[1],
            "pass": None not in recovery and recovery[1] <= 2 * recovery[0],
        },
    }  # fmt: skip


def table(doc: dict[str, Any]) -> str:
    """The markdown table of docs/security.md's "Measured: a job under abuse"."""
    phases = doc["phases"]
    rows = [
        ("longest step gap (s)", "step_gap_s"),
        ("peak driver RSS (MiB)", "driver", "window", "peak_rss_mib"),
        ("peak driver descriptors", "driver", "window", "peak_fds"),
        ("`/v1/status` p99 / max (s)", "status"),
        ("recovery after SIGKILL (s)", "recovery_s"),
    ]
    lines = ["| | undisturbed | abused | target | met |", "|---|---|---|---|---|"]
    met = {
        "step_gap_s": "step_gap_s",
        "driver": "peak_rss_over_undisturbed_mib",
        "status": "status_max_s",
        "recovery_s": "recovery_s",
    }
    for label, *path in rows:
        cells = []
        for phase in ("undisturbed", "abused"):
            value = _get(phases[phase], *path)
            if path == ["status"] and value:
                value = f"{value.get('p99_s')} / {value.get('max_s')}"
            cells.append("—" if value is None else str(value))
        target = "" if path[-1] == "peak_fds" else TARGETS[met[path[0]]]
        verdict = (
            ""
            if path[-1] == "peak_fds"
            else "yes"
            if doc["targets"][met[path[0]]]["pass"]
            else "**no**"
        )
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {target} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the abuse's length")
    parser.add_argument("--silent", type=int, default=2000, help="silent connections a port")
    parser.add_argument("--slow-bodies", type=int, default=500, help="slow login bodies")
    parser.add_argument("--sources", type=int, default=16, help="hostile source addresses")
    parser.add_argument(
        "--rss-safety-mib",
        type=float,
        default=2048.0,
        help="kill the hostile clients when the driver grows this much",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "abuse.json")
    args = parser.parse_args(argv)
    raise_open_file_limit()
    start = time.perf_counter()
    load_before = os.getloadavg()
    code = git_state()
    phases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        for name, abuse in (("undisturbed", False), ("abused", True)):
            t0 = time.perf_counter()
            phases[name] = run_phase(name, Path(tmp) / name, args, abuse)
            phases[name]["wall_s"] = round(time.perf_counter() - t0, 1)
            print(
                f"{name}: {'ok' if phases[name]['ok'] else phases[name].get('error')} in "
                f"{phases[name]['wall_s']} s",
                file=sys.stderr,
                flush=True,
            )
    targets = judge(phases["undisturbed"], phases["abused"])
    doc: dict[str, Any] = {
        "benchmark": "abuse",
        "command": command_line("abuse", argv),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": code,
        "settings": {
            "seconds": args.seconds,
            "silent_per_port": args.silent,
            "slow_bodies": args.slow_bodies,
            "sources": args.sources,
            "workers": WORKERS,
            "hosts": hosts(),
            "step_sleep_s": COMPUTE_S,
            "kill_at": KILL_AT,
        },
        "targets": {name: {"target": TARGETS[name], **value} for name, value in targets.items()},
        "all_pass": all(t["pass"] for t in targets.values()),
        "phases": phases,
        "wall_s": round(time.perf_counter() - start, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    doc["table"] = table(doc)
    text = json.dumps(doc, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    print(doc["table"], file=sys.stderr)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()


if __name__ == "__main__":
    main()
