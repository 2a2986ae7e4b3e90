"""The launcher interface: start one worker process and control it."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSpec:
    """What to run on `hostname`: the user's command, its environment (token included), cwd."""

    hostname: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    log_dir: str | None = None  # detached launch: the worker's output and exit status go here


class WorkerProcess(ABC):
    """A started worker. Its output arrives on `stdout`/`stderr`; `wait()` gives its exit.

    Exit codes follow the shell's convention: a worker killed by signal N exits 128+N
    (`signal` says which signal when it is known).
    """

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    log_dir: str | None = None
    """Set for a detached worker: its output is in `log_dir`/stdout and stderr, not on the
    readers above."""

    @property
    @abstractmethod
    def pid(self) -> int:
        """The local process id (the worker itself, or the ssh client for a remote one)."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait for the worker to end; return its exit code."""

    @property
    @abstractmethod
    def signal(self) -> int | None:
        """The signal that ended the worker, if one did and it is known."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask the worker and its children to stop (SIGTERM). Never raises."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the worker and its children now (SIGKILL). Never raises."""


class SubprocessWorker(WorkerProcess):
    """A worker seen through a local child process (the worker itself, or its ssh client)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        assert process.stdout is not None and process.stderr is not None
        self.stdout = process.stdout
        self.stderr = process.stderr

    @property
    def pid(self) -> int:
        return self._process.pid

    async def wait(self) -> int:
        code = await self._process.wait()
        return 128 - code if code < 0 else code


class Launcher(ABC):
    @abstractmethod
    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        """Start the worker; raise `LaunchError` if it cannot be started at all."""

    async def check_reachable(self, hostname: str, timeout: float) -> None:  # noqa: B027
        """Raise `LaunchError` if `hostname` cannot run workers within `timeout` seconds."""


OUTPUT_LIMIT = 1 << 20  # bytes of one output line kept in the stream reader's buffer
