"""Shared fixtures: run `elasticrun` as a user does and watch what it prints."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import IO, Literal

import pytest

from tests.etcd_server import EtcdServer
from tests.prerequisites import NEED_EVERYTHING, Machine, is_missing_prerequisite, missing_etcd

ELASTICRUN = [sys.executable, "-m", "elastic.driver.cli"]

Stream = Literal["stdout", "stderr"]


class RunningJob:
    """An `elasticrun` process whose output lines are collected as they arrive: `stdout` and
    `stderr` hold each stream's lines, `lines` both streams' in the order they were read."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [*ELASTICRUN, *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._streams: dict[Stream | None, list[str]] = {
            None: self.lines,
            "stdout": self.stdout,
            "stderr": self.stderr,
        }
        self._queue: queue.Queue[tuple[Stream, str | None]] = queue.Queue()
        self._open: set[Stream] = {"stdout", "stderr"}  # streams not yet at their end
        for name, pipe in (("stdout", self.process.stdout), ("stderr", self.process.stderr)):
            threading.Thread(target=self._read, args=(name, pipe), daemon=True).start()

    def _read(self, name: Stream, pipe: IO[bytes] | None) -> None:
        assert pipe is not None
        for raw in pipe:
            self._queue.put((name, raw.decode(errors="replace").rstrip("\n")))
        self._queue.put((name, None))

    def _collect(self, timeout: float) -> tuple[Stream, str] | None:
        """Take the next line read from either stream (None for a stream's end) and record
        it; raise `queue.Empty` if none comes within `timeout` seconds."""
        name, line = self._queue.get(timeout=timeout)
        if line is None:
            self._open.discard(name)
            return None
        self.lines.append(line)
        self._streams[name].append(line)
        return name, line

    def wait_for(
        self, pattern: str, timeout: float = 60.0, stream: Stream | None = None
    ) -> re.Match[str]:
        """Return the first output line (seen before or after this call) matching `pattern`:
        a line of `stream` where one is named, else of either."""
        regex = re.compile(pattern)
        for line in self._streams[stream]:
            if match := regex.search(line):
                return match
        awaited = {stream} if stream else {"stdout", "stderr"}
        deadline = time.monotonic() + timeout
        while awaited & self._open and (remaining := deadline - time.monotonic()) > 0:
            try:
                collected = self._collect(remaining)
            except queue.Empty:
                break
            if collected is None or stream not in (None, collected[0]):
                continue
            if match := regex.search(collected[1]):
                return match
        where = f"{stream} line" if stream else "line"
        raise AssertionError(f"no {where} matching {pattern!r} in:\n{self.transcript()}")

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for the launcher to exit; collect the rest of its output; return its code."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"elasticrun still running after {timeout:g} s:\n{self.transcript()}"
            ) from None
        while self._open:
            self._collect(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def transcript(self) -> str:
        return "\n".join(["--- stdout", *self.stdout, "--- stderr", *self.stderr])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def elasticrun(tmp_path: Path) -> Iterator[Callable[..., RunningJob]]:
    """Start `elasticrun` jobs in `tmp_path`. At the end, every one still running is killed
    with its process group, and so is every process whose command line names a file in
    `tmp_path` (workers, ssh clients and remote agents, should a test leave any)."""
    started: list[RunningJob] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> RunningJob:
        job = RunningJob(args, tmp_path, env)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()
    for pid in processes_naming(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd server on free loopback ports, with its data in `tmp_path`; stopped (by
    PID) at the end. Skipped, with one line saying why, where this machine has no etcd."""
    if reason := missing_etcd(Machine.here()):
        pytest.skip(reason)
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.3 that accepts TCP connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.3", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(body)
    return path


def _state(pid: int | str) -> str | None:
    """The state letter of process `pid` ("Z" for a zombie); None if there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def pids_alive(pids: list[int]) -> list[int]:
    """Those of `pids` that are processes still running (not zombies)."""
    return [pid for pid in pids if _state(pid) not in (None, "Z")]


def processes_naming(marker: str) -> dict[int, list[str]]:
    """Live (non-zombie) processes, other than this one, whose command line contains
    `marker`, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(marker in arg for arg in argv) and _state(entry.name) not in (None, "Z"):
            found[int(entry.name)] = argv
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` (the full fault soak) run only with ELASTIC_SLOW_TESTS=1."""
    if os.environ.get("ELASTIC_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set ELASTIC_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """With ELASTIC_TESTS_NEED_EVERYTHING=1 (`.ci/run`), a test skipped because this machine
    lacks what CI installs (tests/prerequisites.py) fails, so CI cannot skip it unnoticed."""
    report: pytest.TestReport = yield
    if report.skipped and os.environ.get(NEED_EVERYTHING) == "1":
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if is_missing_prerequisite(reason):
            report.outcome = "failed"
            report.longrepr = f"{reason} ({NEED_EVERYTHING}=1: this machine must run it)"
    return report
