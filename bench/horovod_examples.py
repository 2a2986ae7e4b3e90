"""Horovod's own PyTorch examples under elasticrun, with only the import changed.

    python -m bench run horovod_examples --examples ~/horovod --python /path/to/venv/bin/python

`--examples` is a Horovod checkout (or any folder holding the two files below); nothing of
Horovod's is kept in this repository. Each example is copied into a temporary folder with one
change, `import horovod.torch as hvd` -> `import elastic.torch as hvd`; the copy is compared
with the original and the run stops unless that is the only line that differs (the diff is
printed on stderr). Then the real `elasticrun` launcher runs, on this machine (`--no-cuda`,
workers on `localhost` and `127.0.0.1`, which both launch locally):

* `pytorch_synthetic_benchmark.py` (static): `-np N -H localhost:N`, N = 2 and 3;
* `pytorch_synthetic_benchmark_elastic.py` (elastic): `-np N --min-np 1 --max-np N+1
  --failure-scope worker --host-discovery-script discovery_scripts/hosts_file.sh` (the killed
  worker's host-mates go on) on a hosts file that starts as
  `localhost:N`; once rank 0 prints its first `Iter` line the bench adds `127.0.0.1:1`, once
  the driver logs a round of N+1 workers and training goes on it SIGKILLs the worker that was
  launched as rank 1 on localhost (found in /proc by its command line, which names this run's
  temporary folder, and its ELASTIC_RANK), and the job must still finish with exit code 0.

Workers run with `--python` (it must import torch and torchvision; this checkout is put on
PYTHONPATH so it imports `elastic`), one intra-op thread each (`OMP_NUM_THREADS`, see
`--threads`) so that ranks sharing a small machine do not oversubscribe it. The JSON document
(every run's exit code, wall time, the example's img/sec lines, the driver's `round` lines,
whether the host was added and the worker killed) goes to stdout and to
bench/results/horovod_examples.json; each run's full output to bench/results/horovod_examples/.
Exit status 1 when any run failed, 2 when an example is missing or its rewrite is not the
one-line change.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.support.paths import RESULTS, ROOT
from bench.support.provenance import git_state, load_averages

HOSTS_FILE_SCRIPT = ROOT / "discovery_scripts" / "hosts_file.sh"

HOROVOD_IMPORT = "import horovod.torch as hvd"
ELASTIC_IMPORT = "import elastic.torch as hvd"
STATIC_EXAMPLE = "pytorch_synthetic_benchmark.py"
ELASTIC_EXAMPLE = "pytorch_synthetic_benchmark_elastic.py"
# Where the examples lie in a Horovod checkout; a folder holding them directly works too.
CHECKOUT_PLACES = {
    STATIC_EXAMPLE: Path("examples/pytorch"),
    ELASTIC_EXAMPLE: Path("examples/elastic/pytorch"),
}

ITER_LINE = re.compile(r"Iter #(\d+): ([\d.]+) img/sec per (\w+)")
TOTAL_LINE = re.compile(r"Total img/sec on (\d+) \w+\(s\): ([\d.]+) \+-([\d.]+)")
ROUND_LINE = re.compile(r"elasticrun: round (\d+): (\d+) worker\(s\) on ([^()]+?)(?: \((.*)\))?$")

STOP_GRACE_S = 15.0  # SIGTERM to SIGKILL for a launcher that ran past its timeout


class RewriteError(Exception):
    """The example is not one that the one-line import change turns into an elasticrun one."""


def rewrite_import(source: str) -> str:
    """`source` with its one `import horovod.torch as hvd` line made `import elastic.torch as
    hvd`, nothing else touched. Raises RewriteError unless exactly one line is that import."""
    lines = source.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == HOROVOD_IMPORT]
    if len(hits) != 1:
        raise RewriteError(f"expected one line {HOROVOD_IMPORT!r}, found {len(hits)}")
    line = lines[hits[0]]
    lines[hits[0]] = ELASTIC_IMPORT + line[len(HOROVOD_IMPORT) :]
    return "".join(lines)


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    """The (old, new) line pairs that differ between two texts; a line only added or only
    removed pairs with ''. Line endings are compared too."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    pairs: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = old[i1:i2], new[j1:j2]
        for k in range(max(len(removed), len(added))):
            pairs.append(
                (removed[k] if k < len(removed) else "", added[k] if k < len(added) else "")
            )
    return pairs


def check_only_import_changed(before: str, after: str) -> None:
    """Raises RewriteError unless `after` differs from `before` in exactly one line, the
    Horovod import turned into elasticrun's."""
    pairs = changed_lines(before, after)
    expected = [(HOROVOD_IMPORT, ELASTIC_IMPORT)]
    if [(old.rstrip("\r\n"), new.rstrip("\r\n")) for old, new in pairs] != expected:
        raise RewriteError(f"the rewrite changed {pairs!r}, not only the import")


def unified_diff(before: str, after: str, name: str) -> str:
    """The change as `diff -u` shows it, `a/NAME` against `b/NAME`."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )


def find_example(examples: Path, name: str) -> Path:
    """The example `name` in a Horovod checkout or a plain folder (FileNotFoundError if in
    neither place)."""
    for place in (examples / CHECKOUT_PLACES[name] / name, examples / name):
        if place.is_file():
            return place
    raise FileNotFoundError(
        f"{name} is neither in {examples / CHECKOUT_PLACES[name]} nor in {examples}"
    )


@dataclass
class ExampleCopy:
    name: str
    original: Path
    copy: Path
    diff: str


def copy_with_import_changed(original: Path, folder: Path) -> ExampleCopy:
    """Writes the rewritten example into `folder` under its own name, after checking that the
    rewrite changed exactly the import line."""
    before = original.read_text()
    after = rewrite_import(before)
    check_only_import_changed(before, after)
    copy = folder / original.name
    copy.write_text(after)
    return ExampleCopy(original.name, original, copy, unified_diff(before, after, original.name))


@dataclass
class Transcript:
    """The launcher's output lines as they arrive, each with its arrival time (monotonic)."""

    started: float
    lines: queue.Queue[tuple[float, str] | None] = field(default_factory=queue.Queue)
    kept: list[tuple[float, str]] = field(default_factory=list)

    def follow(self, stream: IO[str]) -> threading.Thread:
        def read() -> None:
            for line in stream:
                self.lines.put((time.monotonic() - self.started, line.rstrip("\n")))
            self.lines.put(None)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread


def summarize_output(lines: list[str]) -> dict[str, Any]:
    """The example's img/sec lines and the driver's round lines, parsed."""
    iters = [
        {"iter": int(m[1]), "img_sec": float(m[2]), "device": m[3]}
        for line in lines
        if (m := ITER_LINE.search(line))
    ]
    totals = [
        {"size": int(m[1]), "img_sec": float(m[2]), "conf": float(m[3]), "line": line}
        for line in lines
        if (m := TOTAL_LINE.search(line))
    ]
    rounds = [
        {"round": int(m[1]), "size": int(m[2]), "hosts": m[3], "why": m[4], "line": line}
        for line in lines
        if (m := ROUND_LINE.search(line))
    ]
    return {"iters": iters, "total": totals[-1] if totals else None, "rounds": rounds}


def processes_naming(marker: str) -> list[int]:
    """Live processes other than this one whose command line has an argument containing
    `marker` (this run's temporary folder, so only processes this run started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(marker in arg for arg in argv):
            found.append(int(entry.name))
    return found


def worker_environment(pid: int) -> dict[str, str]:
    """The environment a process was started with ({} when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def find_worker(script: Path, hostname: str, rank: int) -> int | None:
    """The PID of the worker running `script` that was launched as `rank` on `hostname`."""
    for pid in processes_naming(str(script)):
        env = worker_environment(pid)
        if env.get("ELASTIC_HOSTNAME") == hostname and env.get("ELASTIC_RANK") == str(rank):
            return pid
    return None


def write_hosts(path: Path, hosts: list[str]) -> None:
    """Replaces the discovery file atomically, so a discovery run never reads half of it."""
    partial = path.with_suffix(".partial")
    partial.write_text("".join(f"{host}\n" for host in hosts))
    os.replace(partial, path)


def stop(process: subprocess.Popen[str], marker: str) -> list[int]:
    """SIGTERM the launcher, SIGKILL it after STOP_GRACE_S, then SIGKILL any process still
    naming `marker`; returns the PIDs that had to be killed that way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    time.sleep(1.0)
    leftovers = processes_naming(marker)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers


@dataclass
class RunPlan:
    name: str
    kind: str  # "static" or "elastic"
    np: int
    example: ExampleCopy
    example_args: list[str]
    timeout_s: float


class ElasticFaults:
    """The elastic scenario, advanced by the launcher's lines: add a host once training runs,
    kill an incumbent once the job trains on the added host, then watch for the re-form."""

    def __init__(self, plan: RunPlan, hosts_file: Path) -> None:
        self.plan = plan
        self.hosts_file = hosts_file
        self.phase = "wait_training"
        self.added_at_s: float | None = None
        self.killed: dict[str, Any] | None = None
        self.reformed_after_kill: str | None = None

    def see(self, at_s: float, line: str) -> None:
        n = self.plan.np
        round_line = ROUND_LINE.search(line)
        if self.phase == "wait_training" and ITER_LINE.search(line):
            write_hosts(self.hosts_file, [f"localhost:{n}", "127.0.0.1:1"])
            self.added_at_s = at_s
            self.phase = "wait_grown"
            progress(f"  {at_s:6.1f}s added host 127.0.0.1:1")
        elif self.phase == "wait_grown" and round_line and int(round_line[2]) == n + 1:
            self.phase = "wait_training_grown"
        elif self.phase == "wait_training_grown" and ITER_LINE.search(line):
            pid = find_worker(self.plan.example.copy, "localhost", 1)
            if pid is None:
                progress("  no worker launched as rank 1 on localhost is left to kill")
                self.phase = "done"
                return
            os.kill(pid, signal.SIGKILL)
            self.killed = {"pid": pid, "host": "localhost", "launch_rank": 1, "at_s": at_s}
            self.phase = "wait_reformed"
            progress(f"  {at_s:6.1f}s SIGKILLed worker pid {pid} (launched as rank 1)")
        elif self.phase == "wait_reformed" and round_line:
            self.reformed_after_kill = line
            self.phase = "done"


def run_one(
    plan: RunPlan,
    launcher: list[str],
    python: str,
    folder: Path,
    env: dict[str, str],
    transcript_dir: Path,
) -> dict[str, Any]:
    """Runs one example under elasticrun and returns its record."""
    hosts_file = folder / f"{plan.name}.hosts"
    faults = ElasticFaults(plan, hosts_file) if plan.kind == "elastic" else None
    if plan.kind == "static":
        flags = ["-np", str(plan.np), "-H", f"localhost:{plan.np}"]
    else:
        write_hosts(hosts_file, [f"localhost:{plan.np}"])
        env = {**env, "ELASTIC_HOSTS_FILE": str(hosts_file)}
        flags = [
            "-np", str(plan.np), "--min-np", "1", "--max-np", str(plan.np + 1),
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT), "--discovery-interval", "0.5",
            "--failure-scope", "worker",  # the killed worker's host-mates go on
        ]  # fmt: skip
    command = [*launcher, *flags, python, str(plan.example.copy), *plan.example_args]
    progress(f"{plan.name}: {' '.join(command)}")
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1,
    )  # fmt: skip
    transcript = Transcript(started)
    assert process.stdout is not None
    reader = transcript.follow(process.stdout)
    timed_out = False
    while True:
        left = plan.timeout_s - (time.monotonic() - started)
        if left <= 0:
            timed_out = True
            break
        try:
            item = transcript.lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if item is None:
            break
        transcript.kept.append(item)
        if faults is not None:
            faults.see(*item)
    leftovers = stop(process, str(folder)) if timed_out else []
    code = process.wait()
    wall_s = time.monotonic() - started
    reader.join(5.0)
    while not transcript.lines.empty():
        item = transcript.lines.get()
        if item is not None:
            transcript.kept.append(item)
    leftovers += stop(process, str(folder))
    lines = [line for _, line in transcript.kept]
    (transcript_dir / f"{plan.name}.log").write_text(
        "".join(f"{at:7.2f} {line}\n" for at, line in transcript.kept)
    )
    record: dict[str, Any] = {
        "name": plan.name,
        "example": plan.example.name,
        "kind": plan.kind,
        "np": plan.np,
        "command": command,
        "exit_code": code,
        "timed_out": timed_out,
        "wall_s": round(wall_s, 1),
        **summarize_output(lines),
        "leftover_pids_killed": leftovers,
    }
    ok = code == 0 and not timed_out and record["total"] is not None and not leftovers
    if faults is not None:
        record["host_added"] = faults.added_at_s is not None
        record["host_added_at_s"] = faults.added_at_s
        record["worker_killed"] = faults.killed is not None
        record["kill"] = faults.killed
        record["reformed_after_kill"] = faults.reformed_after_kill
        grew = any(r["size"] == plan.np + 1 for r in record["rounds"])
        ok = ok and grew and faults.killed is not None and faults.reformed_after_kill is not None
    record["ok"] = ok
    return record


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def default_launcher() -> list[str]:
    """The `elasticrun` console script on PATH, else the same entry point run as a module."""
    found = shutil.which("elasticrun")
    return [found] if found else [sys.executable, "-m", "elastic.driver.cli"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True, help="a Horovod checkout")
    parser.add_argument("--python", default=sys.executable, help="the workers' interpreter")
    parser.add_argument("--np", default="2,3", help="comma-separated rank counts")
    parser.add_argument("--only", choices=["static", "elastic"], help="run one kind only")
    parser.add_argument("--model", default="resnet18", help="a torchvision model name")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS of every worker")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS / "horovod_examples.json")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    sizes = [int(n) for n in args.np.split(",")]
    common = ["--no-cuda", "--model", args.model, "--batch-size", str(args.batch_size)]
    static_args = [*common, "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
                   "--num-iters", "4"]  # fmt: skip
    elastic_args = [*common, "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
                    "--num-iters", "16"]  # fmt: skip
    launcher = default_launcher()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": args.threads,
        "PYTHONUNBUFFERED": "1",
    }
    with tempfile.TemporaryDirectory(prefix="horovod-examples-") as tmp:
        folder = Path(tmp)
        try:
            copies = {
                name: copy_with_import_changed(find_example(args.examples, name), folder)
                for name in (STATIC_EXAMPLE, ELASTIC_EXAMPLE)
            }
        except (OSError, RewriteError) as error:
            progress(f"horovod_examples: {error}")
            return 2
        for copy in copies.values():
            progress(f"{copy.original}: the one change made\n{copy.diff}")
        transcript_dir = RESULTS / "horovod_examples"
        transcript_dir.mkdir(parents=True, exist_ok=True)
        plans = []
        for n in sizes:
            if args.only in (None, "static"):
                plans.append(RunPlan(f"static_np{n}", "static", n, copies[STATIC_EXAMPLE],
                                     static_args, args.timeout))  # fmt: skip
            if args.only in (None, "elastic"):
                plans.append(RunPlan(f"elastic_np{n}", "elastic", n, copies[ELASTIC_EXAMPLE],
                                     elastic_args, args.timeout))  # fmt: skip
        runs = []
        for plan in plans:
            record = run_one(plan, launcher, args.python, folder, env, transcript_dir)
            progress(f"{plan.name}: exit {record['exit_code']}, {record['wall_s']} s, "
                     f"ok={record['ok']}")  # fmt: skip
            runs.append(record)
    document = {
        "benchmark": "horovod_examples",
        "git": git_state(),
        "load": load_averages(load_before),
        "launcher": launcher,
        "python": args.python,
        "examples": {
            name: {"original": str(c.original), "diff": c.diff} for name, c in copies.items()
        },
        "runs": runs,
        "ok": all(run["ok"] for run in runs),
    }
    text = json.dumps(document, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
