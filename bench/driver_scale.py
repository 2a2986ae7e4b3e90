"""How far the driver scales: 1,000 to 10,000 workers, memory and etcd, beside torch's TCPStore.

    python -m bench run driver_scale --sizes 1000,4000,10000 --backends memory,etcd --out FILE
    python -m bench run driver_scale --sizes 1000 --backends memory --profile driver.prof

The real driver (`elastic.driver.job.Job`: rendezvous, HTTP API, gRPC control service,
liveness checks, with etcd the state saver) runs in a process of its own, one per trial
(`bench.support.driver_process`), so that its CPU time and memory are its own; only its
launcher is fake (`bench.support.simulated_job.FakeLauncher`). N simulated workers
(`bench.support.simulated_workers`: register, event stream, heartbeats, joins, no torch) live
in `--client-processes` other processes, N/k each (`bench.support.simulated_fleet`). This
process only routes: each launch the driver makes starts a simulated worker in one of the
client processes (round robin), and a death is ordered from here.

The job is elastic, `-np N --min-np 1 --max-np N --failure-scope worker` (a death takes no
host-mate with it), on N/8 hosts of 8 slots (`--slots-per-host`;
0: one host `localhost:N`) named 127.1.x.y: loopback addresses that are no interface's, so the
driver treats them as remote hosts reached through ssh (the fake launcher) whose workers'
output comes through pipes, as a real 10,000-worker job's would. The heartbeat interval is
N / 2,000 s between 1 s and 5 s (1 s at 1,000, 2 s at 4,000, 5 s at 10,000: at most 2,000
heartbeats a second; `--heartbeat` overrides), the start timeout 300 s and the cooldown of a
failed host 600 s, so that no host comes back, and nothing is launched, during a trial.

One trial per size and backend; from CLOCK_MONOTONIC stamps, comparable across processes:

* `first_round_s`: the driver's first launch to the last of the N workers receiving its slot
  in round 1 (`start.run_to_first_round_s`: from `Job.run()`, adding the backend claim and
  the servers' start); the driver forms round 1 before it launches anybody, so this is
  launching, registering and opening the streams (a round-1 worker takes its slot from its
  environment, as `elastic.worker.runtime` does; up to commit 223e12d it also joined over
  HTTP). None when the driver declared
  some workers dead first (missed heartbeats while it was too busy to read them): `start`
  then says how many joined round 1, and in which round, after how long, with how many
  workers the job settled (every live worker in the driver's newest round);
* `idle`: after a settling time (the heartbeat interval, at least 2 s), the driver process'
  CPU time over `--idle-seconds` (10) of steady state, heartbeats flowing, as a percentage of
  one core; the client processes' and etcd's beside it; the driver's resident memory
  (`driver_rss_mib`) then, and its peak at the end of the trial (`driver_peak_rss_mib`);
* `one_death`: one worker dies as a SIGKILLed process does: its simulated worker stops at
  once (heartbeats stop, its gRPC stream and HTTP connection close) and, at the same moment,
  the driver's launcher sees its process exit with 137 (`--death stream`: no exit is seen, as
  for a remote worker whose ssh session lingers; the driver must notice the closed stream).
  `told_s`: to the last survivor having received an event that ends its round; `first_round_s`:
  to the last survivor joining a newer round; `reform_s`: to the last survivor joining the
  round the driver settled on (no newer one follows), `rounds` how many rounds were formed;
* `one_percent`: the same for 1 % of the workers (`--death-fraction`) dying at once.
  `declared_dead` counts survivors the driver declared dead meanwhile (missed heartbeats).

Every failed call a simulated worker tries again is counted by call and status
(`worker_retries`). They retry what the worker retries (CANCELLED among it, since the worker's
`ControlClient` retries it too): `workers_with_register_cancelled` counts the workers whose
`Register` ended CANCELLED at least once, a start that failed before it did. The simulated
workers all start the moment they are launched (`--start-spread S`: each after a random delay
of up to S s, as a real worker's interpreter and imports would spread them).

Side by side (`--no-tcpstore` to skip), `bench.support.tcpstore_rendezvous`: N clients of torch's
`TCPStore` (libuv server) in the same number of client processes each `add` a counter and
`wait` on a barrier key set by the last one: what torchrun's c10d rendezvous pays at least.

`--profile FILE` adds one more trial (memory, `--profile-size` workers) with the driver under
cProfile (stats in FILE, a summary in the JSON); `--py-spy FILE` one more, the driver sampled
by py-spy (raw collapsed stacks of the whole trial in FILE, of its rest window in FILE.idle,
of its re-form after one death in FILE.one_death; `--py-spy-native`: with C frames too).
Profiling slows the driver: those trials' times are not the table's.

Open files: each process raises its RLIMIT_NOFILE soft limit to the hard limit (`resource.
setrlimit`): at 10,000 workers the driver holds 10,000 gRPC connections and up to 8,192 HTTP
ones (its own cap, half the limit at most), a client process 2 per worker it simulates.

The JSON document goes to stdout, or to `--out FILE`; progress and a markdown table to stderr.
Targets from the issue are reported beside the figures (`targets`); missing one fails nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support.child_processes import raise_open_files_limit
from bench.support.driver_process import COOLDOWN_S, START_TIMEOUT_S, DriverProcess, host_layout
from bench.support.machine_load import OtherLoad, process_cpu_seconds, process_memory_mib
from bench.support.paths import ROOT
from bench.support.profiles import PySpy, summarize_collapsed, summarize_cprofile
from bench.support.provenance import command_line, git_state, load_averages
from bench.support.simulated_fleet import Fleet
from bench.support.tcpstore_rendezvous import tcpstore_rendezvous

SIZES = (1000, 4000, 10000)
BACKENDS = ("memory", "etcd")
CLIENT_PROCESSES = 4
SLOTS_PER_HOST = 8
HEARTBEATS_PER_S = 2000  # the heartbeat interval grows with N past this rate, up to 5 s
IDLE_WINDOW_S = 10.0
DEATH_FRACTION = 0.01
PHASE_TIMEOUT_S = 180.0
SETTLE_S = 1.0  # between the phases of a trial
KILLED_EXIT = 128 + signal.SIGKILL

# (metric, workers it applies to or None for every size, upper bound, the words)
TARGETS = (
    ("first_round_s", 1000, 2.0, "first round <= 2 s at 1,000 workers"),
    ("first_round_s", 10000, 20.0, "first round <= 20 s at 10,000 workers"),
    ("one_death.reform_s", 1000, 0.5, "re-form after one death <= 0.5 s at 1,000 workers"),
    ("one_death.reform_s", 10000, 5.0, "re-form after one death <= 5 s at 10,000 workers"),
    ("one_percent.rounds", None, 1, "1 % simultaneous deaths = one round"),
    ("idle.driver_cpu_pct", 1000, 5.0, "driver CPU at rest <= 5 % at 1,000 workers"),
)


def heartbeat_for(n: int) -> float:
    """The heartbeat interval of an N-worker job: N / 2,000 s, between 1 s and 5 s."""
    return min(5.0, max(1.0, n / HEARTBEATS_PER_S))


def rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def first_at_or_after(events: list[tuple[int, float]], round_: int, since: float) -> float | None:
    """The time of the first event of `round_` or later, at or after `since`."""
    times = [t for r, t in events if r >= round_ and t >= since]
    return min(times) if times else None


async def settle(
    fleet: Fleet,
    driver: DriverProcess,
    ids: list[str],
    target: int,
    deadline: float,
    ended: Callable[[], str | None],
) -> tuple[int, list[str]]:
    """Wait until every worker of `ids` still alive is in the same round, `target` or later,
    and the driver has formed no newer one; return that round and those workers."""
    members = set(ids)
    while True:
        fleet.expect(ids, target)
        await fleet.changes.wait(
            lambda: fleet.missing == 0,
            f"{fleet.missing} of {len(ids)} workers in round {target}",
            deadline - time.monotonic(),
            ended,
        )
        live = [i for i in fleet.alive() if i in members]
        newest = max((fleet.round_of(i) for i in live), default=target)
        if any(fleet.round_of(i) < newest for i in live):
            target = newest  # a newer round formed while they joined: wait for it too
            continue
        status = await driver.status()
        if status["epoch"] <= newest:
            return newest, live
        target = status["epoch"]  # the driver formed more rounds: wait for the last one


def slowest(
    events: dict[str, list[tuple[int, float]]], ids: list[str], round_: int, since: float
) -> float | None:
    """Seconds from `since` to the last of `ids` having a first event of `round_` or later
    (None if one has none)."""
    times = [first_at_or_after(events.get(i, []), round_, since) for i in ids]
    known = [t for t in times if t is not None]
    return rounded(max(known) - since) if known and len(known) == len(times) else None


async def measure_start(
    fleet: Fleet, driver: DriverProcess, n: int, timeout: float, ended: Callable[[], str | None]
) -> dict[str, Any]:
    """Round 1 (formed before any launch) with every worker, or, when the driver declares
    some dead first, the round it settles on with the others."""
    deadline = time.monotonic() + timeout
    await fleet.changes.wait(lambda: len(fleet.launched) >= n, f"{n} launches", timeout, ended)
    final, live = await settle(fleet, driver, fleet.launched, 1, deadline, ended)
    assert fleet.first_launch is not None and driver.run_at is not None
    cpu = process_cpu_seconds(driver.pid) or 0.0
    in_first = [min((t for r, t in fleet.formed.get(i, []) if r == 1), default=None)
                for i in fleet.launched]  # fmt: skip
    joined = [t for t in in_first if t is not None]
    complete = len(joined) == n
    return {
        "first_round_s": rounded(max(joined) - fleet.first_launch) if complete else None,
        "run_to_first_round_s": rounded(max(joined) - driver.run_at) if complete else None,
        "joined_round_1": len(joined),
        "settled_s": slowest(fleet.formed, live, final, fleet.first_launch),
        "settled_round": final,
        "members_settled": len(live),
        "declared_dead": n - len(live),
        "driver_cpu_s": round(cpu - driver.cpu_at_run, 2),
    }


async def measure_deaths(
    fleet: Fleet,
    driver: DriverProcess,
    victims: list[str],
    exits_seen: bool,
    timeout: float,
    ended: Callable[[], str | None],
) -> dict[str, Any]:
    """Kill `victims` at once; time the survivors' way to the round the driver settles on."""
    before = (await driver.status())["epoch"]
    doomed = set(victims)
    survivors = [i for i in fleet.alive() if i not in doomed]
    deadline = time.monotonic() + timeout
    killed_at = time.monotonic()
    fleet.kill(victims)
    if exits_seen:  # the kernel closes a killed process' sockets as its parent sees it exit
        driver.send({"op": "exit", "ids": victims, "code": KILLED_EXIT, "signal": 9})
    final, live = await settle(fleet, driver, survivors, before + 1, deadline, ended)
    return {
        "deaths": len(victims),
        "survivors": len(live),
        "round_before": before,
        "rounds": final - before,
        "told_s": slowest(fleet.told, live, before, killed_at),
        "first_round_s": slowest(fleet.formed, live, before + 1, killed_at),
        "reform_s": slowest(fleet.formed, live, final, killed_at),
        "declared_dead": len(survivors) - len(live),
    }


async def measure_idle(
    fleet: Fleet,
    driver: DriverProcess,
    etcd_pid: int | None,
    heartbeat: float,
    window: float,
    py_spy: str | None = None,
) -> dict[str, Any]:
    """CPU of the driver, the client processes and etcd over `window` s of steady state
    (`py_spy`: the driver sampled by py-spy meanwhile, into that file)."""
    await asyncio.sleep(max(2.0, heartbeat))  # heartbeats in their rhythm, joins answered
    spy = PySpy(driver.pid, py_spy, window) if py_spy else None
    groups = {"driver": [driver.pid], "clients": fleet.pids, "etcd": [etcd_pid] if etcd_pid else []}

    def cpu() -> dict[str, float]:
        return {k: sum(process_cpu_seconds(p) or 0.0 for p in pids) for k, pids in groups.items()}

    stopped_before = len(fleet.stopped)
    start, t0 = cpu(), time.monotonic()
    await asyncio.sleep(window)
    end, elapsed = cpu(), time.monotonic() - t0
    result: dict[str, Any] = {"window_s": round(elapsed, 2), "workers": len(fleet.alive())}
    for name in groups:
        if groups[name]:
            result[f"{name}_cpu_pct"] = round(100 * (end[name] - start[name]) / elapsed, 1)
    result["declared_dead"] = len(fleet.stopped) - stopped_before
    if spy is not None:
        spy.stop()
    return result


async def run_trial(
    fleet: Fleet,
    n: int,
    backend: str,
    args: argparse.Namespace,
    etcd: Any,
    logs: str,
    *,
    warmup: bool = False,
    profile: str | None = None,
    py_spy: str | None = None,
) -> dict[str, Any]:
    """One job of `n` workers: first round, rest, one death, `--death-fraction` deaths; the
    driver's log goes to the folder `logs`."""
    heartbeat = args.heartbeat or heartbeat_for(n)
    record: dict[str, Any] = {
        "n": n,
        "backend": backend,
        "heartbeat_s": heartbeat,
        "hosts": len(host_layout(n, args.slots_per_host)),
        "ok": False,
    }
    fleet.reset()
    driver = DriverProcess(fleet, Path(logs, f"driver-{n}-{backend}-{time.time():.0f}.log"))
    endpoint = etcd.endpoint if backend == "etcd" else "-"
    argv = [str(n), backend, str(heartbeat), str(args.slots_per_host), endpoint]
    await driver.start(argv + (["--profile", profile] if profile else []))
    spy = PySpy(driver.pid, py_spy) if py_spy else None
    rng = random.Random(args.seed + n)

    def ended() -> str | None:
        return driver.why_ended() or fleet.why_broken()

    timeout = args.phase_timeout
    try:
        record["start"] = start = await measure_start(fleet, driver, n, timeout, ended)
        record["first_round_s"] = start["first_round_s"]
        if not start["members_settled"]:
            raise RuntimeError(
                "no worker is left after the start: every one died or was declared dead"
            )
        if warmup:
            record["ok"] = True
            return record
        etcd_pid = etcd.process.pid if backend == "etcd" else None
        record["idle"] = await measure_idle(
            fleet, driver, etcd_pid, heartbeat, args.idle_seconds,
            py_spy=f"{py_spy}.idle" if py_spy else None,
        )  # fmt: skip
        record["driver_rss_mib"] = process_memory_mib(driver.pid).get("rss_mib")
        exits_seen = args.death == "exit"
        victim = rng.choice(fleet.alive())
        death_spy = PySpy(driver.pid, f"{py_spy}.one_death") if py_spy else None
        try:
            record["one_death"] = await measure_deaths(
                fleet, driver, [victim], exits_seen, timeout, ended
            )
        finally:
            if death_spy is not None:
                death_spy.stop()
        await asyncio.sleep(SETTLE_S)
        count = max(1, round(n * args.death_fraction))
        victims = rng.sample(fleet.alive(), count)
        record["one_percent"] = await measure_deaths(
            fleet, driver, victims, exits_seen, timeout, ended
        )
        record["ok"] = True
    except Exception as err:
        record["error"] = f"{type(err).__name__}: {err}" if str(err) else repr(err)
        record["when_it_failed"] = {  # as the simulated workers saw it
            "launched": len(fleet.launched),
            "joined_round_1": sum(
                any(r == 1 for r, _ in fleet.formed.get(i, [])) for i in fleet.launched
            ),
            "newest_round_joined": max((fleet.round_of(i) for i in fleet.launched), default=0),
            "alive": len(fleet.alive()),
        }
        with contextlib.suppress(Exception):
            record["driver_status"] = await driver.status(30)
    finally:
        record["driver_peak_rss_mib"] = process_memory_mib(driver.pid).get("peak_rss_mib")
        if spy is not None:
            spy.stop()
        fleet.recording = False
        record["exit_code"] = await driver.stop()
        record["driver_log_counts"] = driver.log_counts()
        if not record["ok"]:
            record["driver_log_tail"] = driver.log_tail()
        record["worker_retries"] = dict(fleet.retries.most_common())
        # Before CANCELLED was retried, a worker's start failed on it: these would have exited.
        record["workers_with_register_cancelled"] = len(fleet.register_cancelled)
        if fleet.errors:
            record["worker_errors"] = fleet.errors[:5]
            record["worker_error_count"] = len(fleet.errors)
        await fleet.stop_all()
    record["targets"] = check_targets(record)
    return record


def lookup(record: dict[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets that apply to this trial's size, with the measured value."""
    checked = []
    for metric, workers, bound, words in TARGETS:
        if workers is not None and workers != record["n"]:
            continue
        value = lookup(record, metric)
        met = value is not None and value <= bound
        checked.append({"target": words, "metric": metric, "value": value, "met": met})
    return checked


def cell(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:g}{unit}" if isinstance(value, float | int) else str(value)


def markdown(records: list[dict[str, Any]], references: list[dict[str, Any]]) -> str:
    """One row per size and backend; the TCPStore reference in a second table."""
    rows = [
        "| workers | backend | heartbeat | first round | 1 death: told / joined | 1 % deaths: "
        "joined, rounds | driver CPU at rest | clients CPU at rest | driver RSS (peak) |",
        "|---:|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in records:
        one, many, idle = r.get("one_death") or {}, r.get("one_percent") or {}, r.get("idle") or {}
        start = r.get("start") or {}
        failed = "" if r["ok"] else f" (failed: {r.get('error', '?')[:80]})"
        first = cell(r.get("first_round_s"), " s")
        if r.get("first_round_s") is None and start:
            first = (
                f"never: {start['declared_dead']} declared dead, {start['members_settled']} "
                f"settled in round {start['settled_round']} after {cell(start['settled_s'], ' s')}"
            )
        at_rest = cell(idle.get("driver_cpu_pct"), " %")
        if idle and idle["workers"] != r["n"]:
            at_rest += f" ({idle['workers']:,} workers)"
        rows.append(
            f"| {r['n']:,} | {r['backend']}{failed} | {cell(r['heartbeat_s'], ' s')} | {first} "
            f"| {cell(one.get('told_s'), ' s')} / {cell(one.get('reform_s'), ' s')} "
            f"| {many.get('deaths', '—')} deaths: {cell(many.get('reform_s'), ' s')}, "
            f"{cell(many.get('rounds'))} rounds "
            f"| {at_rest} | {cell(idle.get('clients_cpu_pct'), ' %')} "
            f"| {cell(r.get('driver_rss_mib'), ' MiB')} "
            f"({cell(r.get('driver_peak_rss_mib'), ' MiB')}) |"
        )
    if references:
        rows += [
            "",
            "| workers | TCPStore (libuv): connect | add + wait | total | server CPU |",
            "|---:|---:|---:|---:|---:|",
        ]
        for ref in references:
            rows.append(
                f"| {ref['n']:,} | {cell(ref.get('connect_s'), ' s')} "
                f"| {cell(ref.get('rendezvous_s'), ' s')} | {cell(ref.get('total_s'), ' s')} "
                f"| {cell(ref.get('server_cpu_s'), ' s')} |"
            )
    return "\n".join(rows)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.etcd_server import EtcdServer

    records: list[dict[str, Any]] = []
    references: list[dict[str, Any]] = []
    profile: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp, OtherLoad(tmp) as load:
        logs = args.logs or tmp
        Path(logs).mkdir(parents=True, exist_ok=True)
        etcd = None
        if "etcd" in args.backends:
            etcd = EtcdServer(Path(tmp) / "etcd")
            etcd.start()
        fleet = Fleet(args.client_processes, args.start_spread, args.seed)
        try:
            await fleet.start()
            load.own.update(fleet.pids)
            warm = await run_trial(
                fleet, 2 * args.client_processes, "memory", args, etcd, logs, warmup=True
            )
            if not warm["ok"]:
                raise RuntimeError(f"the warm-up trial failed: {warm.get('error')}")
            for n in args.sizes:
                for backend in args.backends:
                    mark, started = load.mark(), time.monotonic()
                    record = await run_trial(fleet, n, backend, args, etcd, logs)
                    record["other_processes_cpu_pct"] = load.mean_since(mark)
                    record["wall_s"] = round(time.monotonic() - started, 1)
                    records.append(record)
                    print(markdown([record], []).splitlines()[-1], file=sys.stderr, flush=True)
                if args.tcpstore:
                    reference = await tcpstore_rendezvous(n, args.client_processes)
                    references.append(reference)
                    print(f"TCPStore {n}: {reference}", file=sys.stderr, flush=True)
            profile = {}
            if args.profile:  # each profiler in a trial of its own: cProfile slows calls
                trial = await run_trial(
                    fleet, args.profile_size, "memory", args, etcd, logs, profile=args.profile
                )
                profile["cprofile"] = {"trial": trial, **summarize_cprofile(args.profile)}
            if args.py_spy:
                trial = await run_trial(
                    fleet, args.profile_size, "memory", args, etcd, logs, py_spy=args.py_spy
                )
                profile["py_spy"] = {"trial": trial, **summarize_collapsed(args.py_spy)}
                profile["py_spy_at_rest"] = summarize_collapsed(f"{args.py_spy}.idle")
                profile["py_spy_one_death"] = summarize_collapsed(f"{args.py_spy}.one_death")
        finally:
            await fleet.close()
            if etcd is not None:
                etcd.stop()
    return {"records": records, "references": references, "profile": profile}


def environment() -> dict[str, Any]:
    import grpc
    import torch

    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    return {
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "torch": torch.__version__,
        "etcd": run("etcd", "--version").splitlines()[:1],
        "cpus": os.cpu_count(),
        "git": git_state(),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def sizes(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--sizes", type=sizes, default=list(SIZES), help="workers, e.g. 1000,4000")
    parser.add_argument(
        "--backends", type=lambda s: s.split(","), default=list(BACKENDS), help="memory,etcd"
    )
    parser.add_argument(
        "--heartbeat", type=float, default=None, help="heartbeat interval (s) at every size "
        f"(default: N / {HEARTBEATS_PER_S} s between 1 and 5)",
    )  # fmt: skip
    parser.add_argument("--client-processes", type=int, default=CLIENT_PROCESSES)
    parser.add_argument("--slots-per-host", type=int, default=SLOTS_PER_HOST)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_WINDOW_S)
    parser.add_argument("--death-fraction", type=float, default=DEATH_FRACTION)
    parser.add_argument(
        "--death", choices=("exit", "stream"), default="exit",
        help="how the driver learns of a death: the process exit and the closed stream "
        "(exit), or the closed stream and missed heartbeats alone (stream)",
    )  # fmt: skip
    parser.add_argument("--phase-timeout", type=float, default=PHASE_TIMEOUT_S)
    parser.add_argument(
        "--start-spread", type=float, default=0.0, metavar="S",
        help="each simulated worker registers after a random delay of up to S s after its "
        "launch, as a real worker's start-up (interpreter, torch import) spreads them "
        "(default 0: all at once, the harshest storm)",
    )  # fmt: skip
    parser.add_argument("--no-tcpstore", dest="tcpstore", action="store_false")
    parser.add_argument("--profile", metavar="FILE", help="cProfile stats of a profiled trial")
    parser.add_argument(
        "--py-spy", metavar="FILE", help="py-spy raw stacks of a profiled trial (FILE), of its "
        "rest window (FILE.idle) and of its re-form after one death (FILE.one_death)",
    )  # fmt: skip
    parser.add_argument(
        "--py-spy-native", action="store_true",
        help="py-spy samples C frames too (grpc's Cython, libc); it pauses the driver to sample",
    )  # fmt: skip
    parser.add_argument("--profile-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", metavar="FILE", help="write the JSON here, not to stdout")
    parser.add_argument("--logs", metavar="DIR", help="keep the drivers' logs here")
    args = parser.parse_args(argv)
    PySpy.native = args.py_spy_native
    limits = raise_open_files_limit()
    started = time.monotonic()
    load_before = os.getloadavg()
    outcome = asyncio.run(bench(args))
    doc: dict[str, Any] = {
        "benchmark": "scale",
        "command": command_line("driver_scale", argv),
        **environment(),
        "open_files_limit": {"before": list(limits), "raised_to": limits[1]},
        "job": {
            "flags": "-np N --min-np 1 --max-np N --failure-scope worker (elastic, fixed hosts)",
            "hosts": (
                f"N / {args.slots_per_host} hosts of {args.slots_per_host} slots, remote to "
                "the driver (127.1.x.y)"
                if args.slots_per_host > 0
                else "localhost:N"
            ),
            "heartbeat_interval_s": {n: args.heartbeat or heartbeat_for(n) for n in args.sizes},
            "start_timeout_s": START_TIMEOUT_S,
            "cooldown_s": COOLDOWN_S,
            "client_processes": args.client_processes,
            "start_spread_s": args.start_spread,
            "death": args.death,
        },
        "targets": [{"target": t[3], "metric": t[0]} for t in TARGETS],
        "results": outcome["records"],
        "tcpstore": outcome["references"],
        "profile": outcome["profile"],
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_1_5_15min": load_averages(load_before),
    }
    doc["table"] = markdown(outcome["records"], outcome["references"])
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    print(doc["table"], file=sys.stderr)


if __name__ == "__main__":
    main()
