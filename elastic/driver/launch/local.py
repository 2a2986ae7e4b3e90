"""Workers on this machine: a subprocess each, in its own session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from elastic.driver.errors import LaunchError
from elastic.driver.launch.launcher import (
    OUTPUT_LIMIT,
    Launcher,
    SubprocessWorker,
    WorkerProcess,
    WorkerSpec,
)


class LocalProcess(SubprocessWorker):
    """A local worker; signals go to its whole process group, so its children stop too."""

    @property
    def signal(self) -> int | None:
        code = self._process.returncode
        return -code if code is not None and code < 0 else None

    def _send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    def terminate(self) -> None:
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)


class LocalLauncher(Launcher):
    """`Launcher` of local child processes (see `Launcher` for the contract), each the leader
    of its own process group, its output piped to the driver."""

    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                env=spec.env,
                cwd=spec.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=OUTPUT_LIMIT,
            )
        except OSError as err:
            raise LaunchError(f"cannot start {spec.command[0]!r}: {err.strerror}") from None
        return LocalProcess(process)
