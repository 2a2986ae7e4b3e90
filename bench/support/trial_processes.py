"""The processes of one benchmark trial and their output: launchers read line by line, the
workloads' step lines parsed as they arrive, waits on them with timeouts, and a stop that
leaves nothing behind.

The workloads (`bench/workloads/`) print `step S size N rank R pid P t T` after every step
and `enter S size N ...` when they (re-)enter training, `T` being the worker's own
`time.time()`; `Output` collects every line of every process of a trial (stamped on arrival
here) and parses those. `Launcher` starts one process (elasticrun's driver, a torchrun agent,
a store) in a session of its own, and `stop_all` ends them and whatever they started.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

STOP_TIMEOUT = 15.0  # SIGTERM to SIGKILL for the launchers
LEFTOVER_TIMEOUT = 5.0  # launchers gone: how long their workers may take to go too

LINE = re.compile(r"\b(step|enter) (\d+) size (\d+) rank (\d+) pid (\d+) t (\d+\.\d+)")
STAMP = re.compile(r"\bt (\d{9,}\.\d+)")
PID = re.compile(r"\bpid (\d+)")


class TrialFailed(Exception):
    """A trial went wrong (a wait timed out, every launcher exited): recorded, not raised on."""


@dataclass
class Step:
    kind: str  # "step" or "enter"
    step: int
    size: int
    rank: int
    pid: int
    t: float


@dataclass
class Line:
    source: str
    text: str
    arrived: float  # time.time() when read here
    stamp: float | None  # the worker's own time.time(), when the line carries one


class Output:
    """The lines of one trial's processes, parsed as they arrive (reader threads feed it)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lines: list[Line] = []
        self.steps: list[Step] = []  # "step" lines
        self.enters: list[Step] = []  # "enter" lines

    def feed(self, source: str, text: str) -> None:
        arrived = time.time()
        stamp = STAMP.search(text)
        with self.cond:
            self.lines.append(Line(source, text, arrived, float(stamp[1]) if stamp else None))
            if match := LINE.search(text):
                kind, step, size, rank, pid, t = match.groups()
                parsed = Step(kind, int(step), int(size), int(rank), int(pid), float(t))
                (self.steps if kind == "step" else self.enters).append(parsed)
            self.cond.notify_all()

    def wait(
        self,
        what: str,
        predicate: Callable[[Output], Any],
        timeout: float,
        launchers: list[Launcher],
    ) -> Any:
        """Return the first true value of `predicate(self)` (called under the lock, at every
        line); raise `TrialFailed` after `timeout` s or when every launcher has exited."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if value := predicate(self):
                    return value
                if launchers and all(p.process.poll() is not None for p in launchers):
                    codes = [p.process.returncode for p in launchers]
                    raise TrialFailed(f"waiting for {what}: every launcher exited {codes}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TrialFailed(f"waiting for {what}: nothing within {timeout:g} s")
                self.cond.wait(min(remaining, 0.5))

    def transcript(self, since: float) -> str:
        with self.cond:
            return "\n".join(
                f"{line.arrived - since:9.3f} {line.source}: {line.text}" for line in self.lines
            )


def _in_new_session(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    # A new session: a Ctrl-C on the benchmark reaches only the benchmark.
    return subprocess.Popen(cmd, start_new_session=True, **popen)


class Launcher:
    """One process started by the benchmark (elasticrun's driver, a torchrun agent), in its
    own session, with its output read line by line into `output`.

    `start(cmd, **popen)` starts it and must put it in a new session: by default
    `subprocess.Popen` here; the multi-host bed's `Bed.start` bound to a host runs it in that
    host's network namespace (bench/host_faults.py)."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        output: Output,
        cwd: Path,
        start: Callable[..., subprocess.Popen[bytes]] = _in_new_session,
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.started = time.time()
        self.process = start(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._read, args=(stream, output), daemon=True).start()

    def _read(self, stream: IO[bytes] | None, output: Output) -> None:
        assert stream is not None
        for raw in stream:
            output.feed(self.name, raw.decode(errors="replace").rstrip("\n"))


# --- processes ------------------------------------------------------------------------------


def _state(pid: int | str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def processes_naming(marker: str) -> dict[int, str]:
    """Live (non-zombie) processes other than this one whose command line contains `marker`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(marker in arg for arg in argv) and _state(entry.name) not in (None, "Z"):
            found[int(entry.name)] = " ".join(argv).strip()
    return found


def stop_all(launchers: list[Launcher], marker: str) -> dict[str, Any]:
    """SIGTERM every launcher, SIGKILL those left after STOP_TIMEOUT; then make sure no process
    naming `marker` is left (SIGKILL and report any)."""
    start = time.monotonic()
    for launcher in launchers:
        if launcher.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                launcher.process.send_signal(signal.SIGTERM)
    killed = []
    for launcher in launchers:
        remaining = max(0.1, STOP_TIMEOUT - (time.monotonic() - start))
        try:
            launcher.process.wait(remaining)
        except subprocess.TimeoutExpired:
            killed.append(launcher.name)
            launcher.process.kill()
            launcher.process.wait(5)
    stopped_s = time.monotonic() - start
    deadline = time.monotonic() + LEFTOVER_TIMEOUT
    while (left := processes_naming(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return {
        "stop_s": round(stopped_s, 2),
        "exit_codes": {launcher.name: launcher.process.returncode for launcher in launchers},
        "launchers_sigkilled": killed,
        "leftover_processes_sigkilled": [f"{pid}: {argv}" for pid, argv in left.items()],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
