"""Shared fixtures: run `elasticrun` as a user does and watch what it prints."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ELASTICRUN = [sys.executable, "-m", "elastic.driver.cli"]


class RunningJob:
    """An `elasticrun` process whose output lines are collected as they arrive."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*ELASTICRUN, *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._queue.put(raw.decode(errors="replace").rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Return the first output line (seen before or after this call) matching `pattern`."""
        regex = re.compile(pattern)
        for line in self.lines:
            if match := regex.search(line):
                return match
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if match := regex.search(line):
                return match
        raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for the launcher to exit; collect the rest of its output; return its code."""
        code = self.process.wait(timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def elasticrun(tmp_path: Path) -> Iterator[type[RunningJob]]:
    """Start `elasticrun` jobs in `tmp_path`; every one still running at the end is killed."""
    started: list[RunningJob] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> RunningJob:
        job = RunningJob(args, tmp_path, env)
        started.append(job)
        return job

    yield start  # type: ignore[misc]
    for job in started:
        job.stop()


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(body)
    return path


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if status != "Z":
            alive.append(pid)
    return alive
