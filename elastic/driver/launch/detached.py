"""Workers that outlive the driver: each runs under a keeper (see `keeper.py`) in its own
session, with its output in files. A restarted driver re-adopts them by the keeper's pid.

The driver starts local ones itself (`DetachedLauncher`); on another host the ssh agent uses
the same folders and keepers (see `ssh_relay.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from elastic.driver.errors import LaunchError
from elastic.driver.launch.keeper import EXIT_FILE
from elastic.driver.launch.launcher import Adoption, Launcher, WorkerProcess, WorkerSpec
from elastic.driver.launch.private_files import open_private, private_dir

UNKNOWN_EXIT = 255  # a worker that ended while no driver watched and left no exit status
KEEPER_MODULE = "elastic.driver.launch.keeper"


def default_log_root(job_id: str) -> str:
    """Where the detached workers of job `job_id` on this host write their output and exit
    status: `elasticrun-<job_id>` in $TMPDIR (else /tmp), as this process's environment says."""
    return str(Path(os.environ.get("TMPDIR", "/tmp")) / f"elasticrun-{job_id}")


def keeper_command(log_dir: str, command: list[str]) -> list[str]:
    """The command that runs `command` under a keeper writing to `log_dir`."""
    return [sys.executable, "-m", KEEPER_MODULE, log_dir, "--", *command]


def prepare_log_dir(log_root: str, serial: int) -> str:
    """The folder of detached worker `serial` under the job's `log_root`, ready for a keeper.

    `log_root` and `log_root/worker.<serial>` become (or stay: a restarted driver re-adopts
    them) folders of this user with mode 0700; the output files `stdout` and `stderr` exist,
    this user's, 0600; an exit status left by an earlier worker is removed. Raises
    `LaunchError` (one line) when a folder or file is a symbolic link or another user's:
    another local user who knows the job id may have planted it to make this driver (maybe
    root) write where they choose.
    """
    private_dir(log_root)
    folder = os.path.join(log_root, f"worker.{serial}")
    private_dir(folder)
    for stream in ("stdout", "stderr"):
        os.close(open_private(os.path.join(folder, stream)))
    for stale in (EXIT_FILE, f"{EXIT_FILE}.tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, stale))
    return folder


def exit_code_in(log_dir: str) -> int | None:
    """The exit code the keeper recorded in `log_dir`, if it did."""
    try:
        return int((Path(log_dir) / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


class _GroupSignals(WorkerProcess):
    """Signals go to the keeper's whole process group (the keeper ignores the catchable
    ones, so the worker decides, and the keeper records how it ended)."""

    _pid: int
    _code: int | None = None  # the exit code, once known
    detached = True

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def signal(self) -> int | None:
        code = self._code
        return code - 128 if code is not None and 128 < code < 160 else None

    def _send(self, sig: int) -> None:
        if self._code is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, sig)

    def terminate(self) -> None:
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)


class DetachedProcess(_GroupSignals):
    """A keeper this driver started (its child while this driver lives)."""

    def __init__(self, process: asyncio.subprocess.Process, log_dir: str) -> None:
        self._process = process
        self._pid = process.pid
        self.log_dir = log_dir

    async def wait(self) -> int:
        returned = await self._process.wait()
        self._code = 128 - returned if returned < 0 else returned
        return self._code


class AdoptedProcess(_GroupSignals):
    """A keeper started by an earlier driver of the job; its end is seen through a pidfd.

    `wait()` returns at once when the keeper is already gone (its recorded exit code, or
    `UNKNOWN_EXIT` when none was recorded: it was SIGKILLed with its worker). It may be
    called again after a cancelled call.
    """

    def __init__(self, pid: int | None, log_dir: str | None) -> None:
        self._pid = pid or 0
        self.log_dir = log_dir
        self._pidfd: int | None = None
        self._waited = False  # set once a pidfd wait saw the keeper end
        if pid is not None and log_dir is not None and runs_keeper_of(pid, log_dir):
            with contextlib.suppress(ProcessLookupError):
                self._pidfd = os.pidfd_open(pid)
        if self._pidfd is None:  # gone (or its pid is another process's now)
            recorded = exit_code_in(log_dir) if log_dir is not None else None
            self._code = recorded if recorded is not None else UNKNOWN_EXIT

    @property
    def ended_unwatched(self) -> bool:
        """Whether the keeper was gone before this driver adopted it: no driver saw it end."""
        return self._pidfd is None and self._code is not None and not self._waited

    async def wait(self) -> int:
        if self._pidfd is not None:
            loop = asyncio.get_running_loop()
            ended = loop.create_future()
            loop.add_reader(self._pidfd, lambda: ended.done() or ended.set_result(None))
            try:
                await ended
            finally:  # a cancelled wait leaves the pidfd for the next one
                loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
            self._waited = True
            # The keeper writes the code just before it exits.
            assert self.log_dir is not None
            recorded = exit_code_in(self.log_dir)
            self._code = recorded if recorded is not None else UNKNOWN_EXIT
        assert self._code is not None
        return self._code


def _keeper_folder(pid: int) -> str | None:
    """The folder `pid` keeps, if it is a keeper of this user; else (or gone) None."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    module = KEEPER_MODULE.encode()
    if module not in arguments:
        return None
    at = arguments.index(module)
    return os.fsdecode(arguments[at + 1]) if at + 1 < len(arguments) else None


def keepers_under(log_root: str) -> dict[int, str]:
    """The live keepers of this user whose folder is `log_root/worker.<n>`: pid -> folder.

    A driver that dies between launching a worker and saving the job leaves a keeper that no
    saved record names; its restarted successor finds it here."""
    prefix = os.path.join(log_root, "worker.")
    found = {}
    for entry in Path("/proc").iterdir():
        folder = _keeper_folder(int(entry.name)) if entry.name.isdigit() else None
        if folder is not None and folder.startswith(prefix) and "/" not in folder[len(prefix) :]:
            found[int(entry.name)] = folder
    return found


def kill_keeper(pid: int) -> None:
    """SIGKILL a keeper's whole process group: the keeper and its worker, stopped or not."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def runs_keeper_of(pid: int, log_dir: str) -> bool:
    """Whether `pid` is still the keeper of `log_dir` (not a reused pid)."""
    return _keeper_folder(pid) == log_dir


class DetachedLauncher(Launcher):
    """`Launcher` of local workers that outlive the driver (see `Launcher` for the
    contract): starts `spec.command` under a keeper in a new session; output goes to
    `spec.log_dir` (see `prepare_log_dir`). Raises `LaunchError` when that folder is not this
    user's."""

    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        assert spec.log_dir is not None, "a detached worker needs a log directory"
        private_dir(spec.log_dir)  # made by `prepare_log_dir`; checked again, cheaply
        try:
            process = await asyncio.create_subprocess_exec(
                *keeper_command(spec.log_dir, spec.command),
                env=spec.env,
                cwd=spec.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchError(f"cannot start the worker keeper: {err.strerror}") from None
        return DetachedProcess(process, spec.log_dir)

    def adopt(self, adoption: Adoption) -> WorkerProcess:
        """The keeper `adoption.pid` of `adoption.log_dir`, seen through a pidfd (see
        `AdoptedProcess`: ended at once, exit status as recorded, when it is gone)."""
        return AdoptedProcess(adoption.pid, adoption.log_dir)
