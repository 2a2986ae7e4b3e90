"""The fault soak's reusable pieces: a seeded fault injector for a running elastic job, the
scan of /proc for what a job left behind, and the per-fault-kind recovery table.

`Soak` runs one elastic job (etcd backend, hosts discovered from a file, `soak_job.py` as the
training script) and throws a seeded random sequence of faults at it: workers SIGKILLed,
SIGSTOPped (resumed later, or left for the driver to declare dead), SIGTERMed; a host taken
out of the discovery file and put back; the driver SIGKILLed and started again with the same
command; etcd SIGKILLed and started again on the same ports and data dir; and faults aimed at
the only worker left holding the training state (a failed worker takes only itself out:
`--failure-scope worker`, `SoakConfig.failure_scope`). About a third of the faults land within
0-300 ms of the previous one, during its recovery. The seed fixes the plan (kinds, gaps,
victims by position), not the machine's timing, so a seed replays the same plan.

Everything is measured from what the job itself wrote: each step line carries the wall-clock
time its allreduce returned (`t T`), and the worker appends it to a side file of its own;
the launcher's lines are timestamped as they arrive. `tests/e2e/elastic/test_soak.py` runs it and
turns what it recorded into checks; `bench/` may run it for the recovery table alone.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from elastic.protocol.python_command import STANDBY_MODULE
from tests.support.etcd_server import EtcdServer
from tests.support.paths import DISCOVERY_SCRIPTS, WORKERS
from tests.support.processes import processes_naming, standby_processes
from tests.support.running_job import RunningJob, Stream

SOAK_JOB = WORKERS / "soak_job.py"
SHARDED_SOAK_JOB = WORKERS / "sharded_soak_job.py"
JOB_SCRIPTS = (SOAK_JOB.name, SHARDED_SOAK_JOB.name)
HOSTS_FILE_SCRIPT = DISCOVERY_SCRIPTS / "hosts_file.sh"
KEEPER = "elastic.driver.launch.keeper"
AGENT = "elastic.driver.launch.ssh_agent"
DRIVER = "elastic.driver.cli"

KINDS = (
    "worker_sigkill",
    "worker_sigstop",
    "worker_sigterm",
    "host_remove",
    "driver_restart",
    "etcd_restart",
    "survivor",
)
"""Every fault kind the injector throws; each appears at least once in a plan of 7 or more."""

WEIGHTS = {
    "worker_sigkill": 5,
    "worker_sigstop": 3,
    "worker_sigterm": 3,
    "host_remove": 3,
    "driver_restart": 3,
    "etcd_restart": 3,
    "survivor": 3,
}

STEP = re.compile(r"step (\d+) epoch (\d+) size (\d+) rank (\d+) pid (\d+) t (\d+\.\d+)")
EXPLAINED_RESET = re.compile(
    r"state (was |is )?lost|from scratch|starting over|start(s|ing)? afresh|no commit"
    r"|only copy of its state|resuming from the durable checkpoint",
    re.I,
)
"""A launcher or worker line that says why training went back to an earlier epoch."""


@dataclass(frozen=True)
class StepLine:
    t: float
    step: int
    epoch: int
    size: int
    rank: int
    pid: int
    text: str

    @classmethod
    def parse(cls, text: str) -> StepLine | None:
        match = STEP.search(text)
        if match is None:
            return None
        step, epoch, size, rank, pid = (int(g) for g in match.groups()[:5])
        return cls(float(match.group(6)), step, epoch, size, rank, pid, match.group(0))


@dataclass
class Fault:
    index: int
    kind: str
    at: float  # time.time() when it was injected
    detail: str
    overlapped: bool  # injected within 0-300 ms of the previous fault, not after a step


@dataclass
class Event:
    """Something the soak did that is not a fault: a resume, a host put back, a restart."""

    at: float
    what: str


class TimedJob(RunningJob):
    """A `RunningJob` that also keeps every output line with the time it arrived."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.timed: list[tuple[float, Stream, str]] = []
        self.started_at = time.time()
        super().__init__(args, cwd, env)

    def _read(self, name: Stream, pipe: IO[bytes] | None) -> None:
        assert pipe is not None
        for raw in pipe:
            line = raw.decode(errors="replace").rstrip("\n")
            self.timed.append((time.time(), name, line))
            self._queue.put((name, line))
        self._queue.put((name, None))


class SideFiles:
    """The step lines workers append to `<folder>/<pid>.log`, read as they grow."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._offsets: dict[Path, int] = {}
        self.lines: dict[int, list[str]] = {}  # pid -> its lines, complete ones only
        self.steps: list[StepLine] = []
        self.latest = 0.0  # the newest step time seen

    def poll(self) -> None:
        for path in self.folder.glob("*.log"):
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as file:
                    file.seek(offset)
                    chunk = file.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1
            self._offsets[path] = offset + end
            for raw in chunk[:end].decode(errors="replace").splitlines():
                self.lines.setdefault(int(path.stem), []).append(raw)
                if (step := StepLine.parse(raw)) is not None:
                    self.steps.append(step)
                    self.latest = max(self.latest, step.t)

    def first_step_after(self, when: float) -> StepLine | None:
        after = [s for s in self.steps if s.t > when]
        return min(after, key=lambda s: s.t) if after else None

    def recent_pids(self, since: float) -> set[int]:
        return {s.pid for s in self.steps if s.t >= since}


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def job_processes(marker: str) -> dict[int, tuple[str, str, list[str]]]:
    """The live processes of a job whose command lines name `marker` (the test's tmp_path),
    and its standbys, whose environments do: pid -> (role, state letter, argv), role being
    `worker` (a standby too), `keeper`, `agent` (the ssh agent of a remote worker) or
    `driver`."""
    found = {}
    waiting = standby_processes(marker)
    standbys = {pid: argv for pid, argv in processes_naming(STANDBY_MODULE).items()
                if pid in waiting}  # fmt: skip
    for pid, argv in {**processes_naming(marker), **standbys}.items():
        if pid in standbys:  # waiting, or a worker that started in it: its launch environment
            role = "worker"  # names `marker`, its command line does not
        elif KEEPER in argv:
            role = "keeper"
        elif AGENT in argv:
            role = "agent"
        elif DRIVER in argv:
            role = "driver"
        elif any(arg.endswith(JOB_SCRIPTS) for arg in argv):
            role = "worker"
        else:
            continue  # etcd (its data dir is in tmp_path), a discovery script
        state = _state(pid)
        if state is not None and state != "Z":
            found[pid] = (role, state, argv)
    return found


def dump_stacks(folder: Path, why: str) -> None:
    """Append where every live process naming `folder` is to `folder/stacks.txt` (needs
    `py-spy`, which the tests do not install: a diagnosis aid for whoever reproduces a
    hang)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return
    with open(folder / "stacks.txt", "a") as out:
        out.write(f"=== {why}\n")
        for pid, (role, state, _) in sorted(job_processes(str(folder)).items()):
            dump = subprocess.run(
                [spy, "dump", "--locals", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            out.write(f"--- pid {pid} {role} state {state}\n{dump.stdout}{dump.stderr}\n")


def recovery_table(faults: list[Fault], steps: list[StepLine]) -> dict[str, dict]:
    """Per fault kind thrown: how long from the fault to the next training step (any rank):
    count, median and max in seconds, and how many faults no step followed."""
    times = sorted(s.t for s in steps)
    table: dict[str, dict] = {}
    for kind in dict.fromkeys(f.kind for f in faults):
        waits, never = [], 0
        for fault in (f for f in faults if f.kind == kind):
            later = [t for t in times if t > fault.at]
            if later:
                waits.append(later[0] - fault.at)
            else:
                never += 1
        table[kind] = {
            "count": len(waits) + never,
            "median_s": round(statistics.median(waits), 3) if waits else None,
            "max_s": round(max(waits), 3) if waits else None,
            "no_step_after": never,
        }
    return table


def epoch_regressions(steps: list[StepLine]) -> list[tuple[StepLine, StepLine]]:
    """Where the training epoch went backwards, in the order the steps were trained: pairs
    (the newest step of the higher epoch, the first step of the lower one)."""
    found = []
    top: StepLine | None = None
    for step in sorted(steps, key=lambda s: s.t):
        if top is not None and step.epoch < top.epoch:
            found.append((top, step))
            top = step
        elif top is None or step.epoch >= top.epoch:
            top = step
    return found


def worker_lines_in(output: list[str]) -> set[str]:
    """The worker lines relayed by the launcher (`[R]<stdout>:TEXT` -> TEXT)."""
    relayed = set()
    for line in output:
        head, sep, text = line.partition("<stdout>:")
        if sep and head.startswith("["):
            relayed.add(text)
    return relayed


@dataclass
class SoakConfig:
    seed: int
    faults: int
    overlap: float = 0.3  # share of faults injected 0-300 ms after the previous one
    gap: tuple[float, float] = (0.3, 1.5)  # seconds after recovery, otherwise
    stall_timeout: float = 45.0  # no step this long after a fault: a stall, stop injecting
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
    slots: int = 2
    job_id: str = "soak"
    weights: dict[str, int] = field(default_factory=lambda: dict(WEIGHTS))  # kind -> weight
    # The faults hit one worker each (a host's are hit by `host_remove`): a failed worker
    # leaves its host-mate training, as --failure-scope worker says.
    failure_scope: str = "worker"
    launcher_args: tuple[str, ...] = ()  # more `elasticrun` flags (ssh options)
    job: Path = SOAK_JOB  # the training script: soak_job.py or sharded_soak_job.py


@dataclass
class Soak:
    """One soak run. `start()` launches the job, `inject()` throws the faults, `finish()`
    lets the job end; everything seen is kept on the object for the checks."""

    config: SoakConfig
    folder: Path
    etcd: EtcdServer
    rng: random.Random = field(init=False)
    faults: list[Fault] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    drivers: list[TimedJob] = field(default_factory=list)
    anomalies: list[dict] = field(default_factory=list)  # {"what", "since", "until"}
    signalled: set[int] = field(default_factory=set)  # pids sent SIGKILL/SIGTERM/left stopped
    stopped: set[int] = field(default_factory=set)  # pids SIGSTOPped and not resumed
    final_code: int | None = None
    _pending: list[tuple[float, int, str, Callable[[], None]]] = field(default_factory=list)
    _seq: int = 0
    _removed: dict[str, float] = field(default_factory=dict)  # host -> when it was taken out
    _killed: set[TimedJob] = field(default_factory=set)  # drivers this soak killed or waited on

    def __post_init__(self) -> None:
        self.rng = random.Random(self.config.seed)
        self.side = SideFiles(self.folder / "side")
        self.hosts_file = self.folder / "hosts"
        self.stop_file = self.folder / "stop"
        self.runtime_folder = self.folder / "run"
        self.runtime_folder.mkdir(mode=0o700, exist_ok=True)

    # --- the job ----------------------------------------------------------------------------

    def command(self) -> list[str]:
        c = self.config
        return [
            "--backend", "etcd", "--etcd-endpoints", self.etcd.endpoint, "--job-id", c.job_id,
            "--min-np", "1", "--max-np", str(len(c.hosts) * c.slots),
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT), "--discovery-interval", "0.2",
            "--heartbeat-interval", "0.5", "--blacklist-cooldown-range", "0.5", "2",
            "--failure-scope", c.failure_scope,
            "--elastic-timeout", "60", "--etcd-grace", "5", "--stop-grace", "2",
            # a hung joiner (the only one that could take a leaver's state) is timed out, and a
            # new one started, within the stall limit; yet four workers importing torch at once
            # on 2 cores (after the fleet is lost) take up to ~13 s to reach the rendezvous
            "--start-timeout", "25", *c.launcher_args,
            sys.executable, str(c.job), "--out", str(self.folder),
            "--side-dir", str(self.side.folder), "--stop-file", str(self.stop_file),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        # The job file (which keeps the token for the next driver) lives in this soak's own
        # runtime folder: another soak of job "soak" on this host must not replace it.
        return {
            "ELASTIC_HOSTS_FILE": str(self.hosts_file),
            "TMPDIR": str(self.folder),
            "XDG_RUNTIME_DIR": str(self.runtime_folder),
        }

    @property
    def driver(self) -> TimedJob | None:
        return self.drivers[-1] if self.drivers else None

    def _driver_up(self) -> bool:
        return self.driver is not None and self.driver.process.poll() is None

    def _start_driver(self) -> None:
        if not self.etcd.running:  # a driver cannot start without its backend: restore it
            self._run_pending(lambda what: what.startswith("etcd start"))
            self._start_etcd()
        self.drivers.append(TimedJob(self.command(), self.folder, self.env()))
        self._event(f"driver started, pid {self.driver.process.pid}")

    def _start_etcd(self) -> None:
        if not self.etcd.running:
            self.etcd.start()

    def _write_hosts(self) -> None:
        present = [h for h in self.config.hosts if h not in self._removed]
        staged = self.hosts_file.with_suffix(".new")
        staged.write_text("".join(f"{h}:{self.config.slots}\n" for h in present))
        staged.replace(self.hosts_file)

    def start(self) -> None:
        self.side.folder.mkdir()
        self._write_hosts()
        self._start_driver()
        deadline = time.monotonic() + 90
        while not self.side.steps:
            self._tick()
            if time.monotonic() > deadline or not self._driver_up():
                raise AssertionError(f"the soak job did not start:\n{self.driver.transcript()}")
            time.sleep(0.05)

    def stop_all(self) -> None:
        """End every driver this soak started (by pid); the fixtures end the rest."""
        for job in self.drivers:
            job.stop()

    # --- bookkeeping ------------------------------------------------------------------------

    def _anomaly(self, what: str, since: float) -> None:
        self.anomalies.append({"what": what, "since": since, "until": time.time()})
        dump_stacks(self.folder, f"{len(self.anomalies)}: {what}")

    def _event(self, what: str) -> None:
        self.events.append(Event(time.time(), what))

    def _later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (time.time() + delay, self._seq, what, action))

    def _run_pending(self, which: Callable[[str], bool] = lambda what: True) -> None:
        """Carry out now the pending actions `which` selects, in their order."""
        chosen = sorted(p for p in self._pending if which(p[2]))
        self._pending = [p for p in self._pending if not which(p[2])]
        heapq.heapify(self._pending)
        for _, _, what, action in chosen:
            action()
            self._event(what + " (early)")

    def _tick(self) -> None:
        """Carry out the actions that are due, read new step lines, notice a driver that
        ended without being killed."""
        while self._pending and self._pending[0][0] <= time.time():
            _, _, what, action = heapq.heappop(self._pending)
            action()
            self._event(what)
        self.side.poll()
        job = self.driver
        if job is not None and job.process.poll() is not None and job not in self._killed:
            self._killed.add(job)
            self._anomaly(
                f"the driver (pid {job.process.pid}) exited with code {job.process.returncode} "
                "during the soak, without being killed",
                job.started_at,
            )

    def _wait(self, seconds: float) -> None:
        until = time.time() + seconds
        while time.time() < until:
            self._tick()
            time.sleep(min(0.02, max(0.0, until - time.time())))

    def _wait_for_step_after(self, when: float) -> bool:
        deadline = time.time() + self.config.stall_timeout
        while time.time() < deadline:
            self._tick()
            if self.side.latest > when:
                return True
            if self.anomalies:
                return False
            time.sleep(0.05)
        return False

    # --- choosing victims -------------------------------------------------------------------

    def workers(self) -> list[int]:
        """Live worker processes not already signalled or held stopped, oldest pid first."""
        return sorted(
            pid
            for pid, (role, state, _) in job_processes(str(self.folder)).items()
            if role == "worker" and state != "T" and pid not in self.signalled
        )

    def _victim(self) -> int | None:
        """A worker to hit: mostly one that trained in the last 2 s, else any live one."""
        live = self.workers()
        training = sorted(self.side.recent_pids(time.time() - 2.0) & set(live))
        pool = training if training and self.rng.random() < 0.75 else live
        return self.rng.choice(pool) if pool else None

    def _signal(self, pid: int, sig: signal.Signals) -> bool:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.signalled.add(pid)
        return True

    def _resume(self, pid: int) -> None:
        self.stopped.discard(pid)
        self.signalled.discard(pid)
        self._signal(pid, signal.SIGCONT)

    # --- the faults -------------------------------------------------------------------------

    def plan(self) -> list[str]:
        """The kinds of the faults in order: every kind once (shuffled), then weighted."""
        weights = self.config.weights
        kinds = list(weights)
        self.rng.shuffle(kinds)
        rest = self.rng.choices(
            kinds, weights=[weights[k] for k in kinds], k=max(0, self.config.faults - len(kinds))
        )
        return (kinds + rest)[: self.config.faults]

    def inject(self) -> None:
        """Throw the planned faults; stop early on a stall or a driver that ended itself."""
        for index, kind in enumerate(self.plan()):
            overlapped = bool(self.faults) and self.rng.random() < self.config.overlap
            if overlapped:
                self._wait(self.rng.uniform(0.0, 0.3))
            elif self.faults:
                if not self._wait_for_step_after(self.faults[-1].at):
                    if not self.anomalies:
                        self._anomaly(
                            f"no training step within {self.config.stall_timeout:g} s of "
                            f"fault #{self.faults[-1].index} ({self.faults[-1].kind})",
                            self.faults[-1].at,
                        )
                    return
                self._wait(self.rng.uniform(*self.config.gap))
            if self.anomalies:
                return
            detail = getattr(self, f"_fault_{kind}")()
            if detail is None:  # nothing to hit now (no worker alive): throw another kind
                kind = self.rng.choice(["host_remove", "driver_restart", "etcd_restart"])
                detail = getattr(self, f"_fault_{kind}")()
            self.faults.append(Fault(index, kind, time.time(), detail, overlapped))

    def _fault_worker_sigkill(self) -> str | None:
        pid = self._victim()
        if pid is None or not self._signal(pid, signal.SIGKILL):
            return None
        return f"SIGKILL worker {pid}"

    def _fault_worker_sigterm(self) -> str | None:
        pid = self._victim()
        if pid is None or not self._signal(pid, signal.SIGTERM):
            return None
        return f"SIGTERM worker {pid}"

    def _fault_worker_sigstop(self) -> str | None:
        pid = self._victim()
        if pid is None or not self._signal(pid, signal.SIGSTOP):
            return None
        self.stopped.add(pid)
        if self.rng.random() < 0.5:  # back before 3 heartbeats (1.5 s) are missed
            delay = self.rng.uniform(0.2, 1.0)
            self._later(delay, f"SIGCONT worker {pid}", lambda: self._resume(pid))
            return f"SIGSTOP worker {pid}, SIGCONT in {delay:.2f} s"
        self.signalled.add(pid)  # left for the driver to declare dead and kill
        return f"SIGSTOP worker {pid}, left stopped for the driver"

    def _fault_host_remove(self) -> str:
        present = [h for h in self.config.hosts if h not in self._removed]
        back = ""
        if len(present) == 1:  # never take the last host: put one back first
            self._run_pending(lambda what: what.startswith("host back"))
            back = "hosts put back first; "
            present = [h for h in self.config.hosts if h not in self._removed]
        host = self.rng.choice(present)
        self._removed[host] = time.time()
        self._write_hosts()
        delay = self.rng.uniform(1.0, 4.0)

        def put_back() -> None:
            self._removed.pop(host, None)
            self._write_hosts()

        self._later(delay, f"host back {host}", put_back)
        return f"{back}host {host} removed from discovery for {delay:.2f} s"

    def _fault_driver_restart(self) -> str:
        extra = ""
        if not self._driver_up():  # killed before and not back yet: bring it back now
            self._run_pending(lambda what: what.startswith("driver start"))
            extra = "driver restarted early; "
        job = self.driver
        assert job is not None
        self._killed.add(job)
        os.kill(job.process.pid, signal.SIGKILL)
        job.process.wait()
        delay = self.rng.uniform(0.0, 1.5)
        self._later(delay, "driver start", self._start_driver)
        return f"{extra}SIGKILL driver {job.process.pid}, restart in {delay:.2f} s"

    def _fault_etcd_restart(self) -> str:
        if not self.etcd.running:
            self._run_pending(lambda what: what.startswith("etcd start"))
        self.etcd.stop()
        delay = self.rng.uniform(0.0, 2.0)
        self._later(delay, "etcd start", self._start_etcd)
        return f"SIGKILL etcd, start again in {delay:.2f} s"

    def _fault_survivor(self) -> str | None:
        """Make one worker the only holder of the training state, then hit it: SIGKILL or
        SIGSTOP (left for the driver) while a joiner is starting, or SIGTERM; with no other
        worker alive, a SIGSTOP undone within 1 s (the job must be able to go on)."""
        live = self.workers()
        training = sorted(self.side.recent_pids(time.time() - 3.0) & set(live))
        if not training:
            return None
        holder = max(training, key=lambda p: max(s.t for s in self.side.steps if s.pid == p))
        others = [p for p in training if p != holder]
        for pid in others:
            self._signal(pid, signal.SIGKILL)
        self._wait(self.rng.uniform(0.0, 0.3))
        joiners = [p for p in self.workers() if p != holder]
        how = self.rng.choice(["SIGKILL", "SIGTERM", "SIGSTOP"])
        if how != "SIGTERM" and not joiners:
            how = "SIGSTOP-resumed"
        prefix = f"SIGKILL workers {others}, then " if others else ""
        if how == "SIGSTOP-resumed":
            self._signal(holder, signal.SIGSTOP)
            self.stopped.add(holder)
            delay = self.rng.uniform(0.2, 1.0)
            self._later(delay, f"SIGCONT worker {holder}", lambda: self._resume(holder))
            return f"{prefix}SIGSTOP the sole state holder {holder}, SIGCONT in {delay:.2f} s"
        if how == "SIGSTOP":
            self._signal(holder, signal.SIGSTOP)
            self.stopped.add(holder)
            self.signalled.add(holder)
            return (
                f"{prefix}SIGSTOP the sole state holder {holder} (left for the driver; "
                f"joiners {joiners})"
            )
        self._signal(holder, getattr(signal, how))
        return f"{prefix}{how} the sole state holder {holder} (joiners {joiners})"

    # --- the end ----------------------------------------------------------------------------

    def finish(self, timeout: float) -> None:
        """Undo what is pending (hosts back, stopped workers resumed, etcd and driver up),
        let the job stop at its next epoch, and wait for the launcher to exit."""
        self._run_pending()
        for pid in list(self.stopped - self.signalled):
            self._resume(pid)
        self._start_etcd()
        if not self._driver_up():
            self._start_driver()
        self._event("stop file written")
        self.stop_file.touch()
        deadline = time.time() + timeout
        job = self.driver
        assert job is not None
        while time.time() < deadline and job.process.poll() is None:
            self.side.poll()
            time.sleep(0.1)
        if job.process.poll() is None:
            self._anomaly(
                f"the launcher did not exit within {timeout:g} s of the stop", time.time() - 30
            )
            return
        self._killed.add(job)
        self.final_code = job.finish(30)
        self.side.poll()

    def leftovers(self, wait: float = 15.0) -> dict[int, tuple[str, str, list[str]]]:
        """Workers, keepers and drivers of this job still alive `wait` s after the end."""
        deadline = time.monotonic() + wait
        while (left := job_processes(str(self.folder))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    # --- what the launcher showed -----------------------------------------------------------

    def may_lose(self, pid: int, line: str) -> bool:
        """Whether worker `pid`'s output `line` may never reach the launcher: here never (the
        driver restarts, but it finds every worker's output where it was left)."""
        return False

    def launcher_lines(self) -> list[tuple[float, Stream, str]]:
        return sorted((entry for job in self.drivers for entry in job.timed), key=lambda e: e[0])

    def around(self, first: float, last: float | None = None) -> dict[str, list]:
        """The evidence for something seen between `first` and `last` (a moment when `last`
        is None): the four faults before it and those during it, the soak's events and the
        launcher's lines (not step lines) from 2 s before to 3 s after."""
        last = first if last is None else last
        zero = self.faults[0].at if self.faults else first

        def rel(t: float) -> str:
            return f"{t - zero:+8.3f}s"

        before = [f for f in self.faults if f.at < first][-4:]
        during = [f for f in self.faults if first <= f.at <= last]
        lines = [
            f"{rel(t)} {line}"
            for t, _, line in self.launcher_lines()
            if first - 2 <= t <= last + 3 and not StepLine.parse(line)
        ]
        return {
            "faults": [f"{rel(f.at)} #{f.index} {f.kind}: {f.detail}" for f in before + during],
            "events": [
                f"{rel(e.at)} {e.what}" for e in self.events if first - 10 <= e.at <= last + 3
            ],
            "launcher": lines[:30]
            + ([f"... {len(lines) - 60} more ..."] if len(lines) > 60 else [])
            + lines[max(30, len(lines) - 30) :],
        }

    def record(self) -> dict:
        return {
            "config": asdict(self.config),
            "faults": [asdict(f) for f in self.faults],
            "events": [asdict(e) for e in self.events],
            "anomalies": self.anomalies,
            "drivers": [
                {"pid": job.process.pid, "code": job.process.returncode} for job in self.drivers
            ],
            "final_code": self.final_code,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.record(), indent=1, default=str))
