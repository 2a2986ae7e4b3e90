"""An `elasticrun` process run as a user runs it, its output lines collected as they arrive
(`RunningJob`); the `elasticrun` fixture (tests/conftest.py) starts them and ends them."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Literal

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

    def drain(self) -> None:
        """Record every line read so far, without waiting for more."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._collect(0)

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
