"""The launcher interface: start one worker process (`Launcher`) and control it
(`WorkerProcess`).

Implementations: `LocalLauncher` (`local.py`, a child process in its own process group),
`DetachedLauncher` (`detached.py`, under a keeper, outliving the driver) and `SshLauncher`
(`ssh.py`, on a remote host through the ssh agent, owned or detached).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elastic.driver.errors import LaunchError

Located = Callable[[int, str], None]
"""Told a detached remote worker's keeper pid and folder on its host, once its agent says."""


@dataclass(frozen=True)
class HostFolder:
    """A detached worker's folder on its host, named by the job's scheme: `worker.<serial>`
    under `default_log_root(job_id)` as the user on that host sees it (its own $TMPDIR)."""

    job_id: str
    serial: int
    slot: int | None = None  # its slot on the host: a worker launched on it stops any other
    # worker of the job still holding that slot (one the driver counted out while cut off)


@dataclass(frozen=True)
class WorkerSpec:
    """What to run on `hostname`: the user's command, its environment (token included), cwd."""

    hostname: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    log_dir: str | None = None  # detached local launch: the worker's output and exit status
    host_folder: HostFolder | None = None  # detached remote launch: its folder over there
    located: Located | None = None  # detached remote launch: told where it runs over there


@dataclass(frozen=True)
class Adoption:
    """A detached worker that an earlier driver of the job launched, as its journal recorded
    it, for `Launcher.adopt`."""

    hostname: str
    host_folder: HostFolder
    pid: int | None  # its keeper's pid (on its host)
    log_dir: str | None  # its folder (on its host)
    offsets: Mapping[str, int] = field(default_factory=dict)  # output shown, per stream
    adopted_here: frozenset[int] = frozenset()  # serials of every worker adopted on its host
    last_serial: int = 0  # the earlier drivers numbered no worker above this
    located: Located | None = None


class WorkerProcess(ABC):
    """A started worker. Its output arrives on `stdout`/`stderr`; `wait()` gives its exit.

    Exit codes follow the shell's convention: a worker killed by signal N exits 128+N
    (`signal` says which signal when it is known).
    """

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    log_dir: str | None = None
    """Set for a detached local worker: its output is in `log_dir`/stdout and stderr, not on
    the readers above."""
    detached: bool = False
    """Whether the worker outlives the driver: the bytes of its output shown are counted
    (`Worker.offsets`), so that a restarted driver shows the rest, once."""

    @property
    @abstractmethod
    def pid(self) -> int:
        """Which process this is.

        Returns:
            The local process id (the worker itself, its keeper, or the ssh client for a
            remote one); for a detached remote one, its keeper's pid on its host (0 until
            known).
        """

    @property
    def ended_unwatched(self) -> bool:
        """Whether an adopted worker had ended before this driver adopted it (no driver saw
        it end)."""
        return False

    @abstractmethod
    async def wait(self) -> int:
        """Wait for the worker to end. Never raises for how it ended.

        Returns:
            Its exit code: 128+N when signal N ended it; 255 when no exit status was left
            (ssh lost its host, or it ended unwatched without recording one).
        """

    @property
    @abstractmethod
    def signal(self) -> int | None:
        """How the worker ended, when a signal ended it.

        Returns:
            The signal's number, or None when no signal ended it, it has not ended, or
            which one is not known.
        """

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
    """Starts workers of one kind (local, detached, over ssh) and re-adopts detached ones."""

    @abstractmethod
    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        """Start one worker.

        Args:
            spec: what to run, where, with which environment (and, detached, where its
                output and exit status go).

        Returns:
            The started worker. A worker that starts and then fails (its command exits at
            once) is started: its exit code says what happened.

        Raises:
            LaunchError: it cannot be started at all (no such host, ssh refused, a folder
                that is not this user's); one line says why.
        """

    async def check_reachable(self, hostname: str, timeout: float) -> None:  # noqa: B027
        """Check that a host can run workers (by default: every host can).

        Args:
            hostname: the host to check.
            timeout: seconds the check may take.

        Raises:
            LaunchError: `hostname` cannot run workers within `timeout` seconds.
        """

    def adopt(self, adoption: Adoption) -> WorkerProcess:
        """Watch a detached worker that an earlier driver launched with this kind of
        launcher. Never waits.

        Args:
            adoption: the worker as the job's journal recorded it.

        Returns:
            The worker, as `launch` would have returned it; one that ended while no driver
            watched says so (`WorkerProcess.ended_unwatched`).

        Raises:
            LaunchError: workers of this kind end with their driver (the default).
        """
        raise LaunchError(f"cannot re-adopt the worker on host {adoption.hostname}")


OUTPUT_LIMIT = 1 << 20  # bytes of one output line kept in the stream reader's buffer
