"""Workers on other hosts: `ssh` to the host, where `ssh_agent` starts and owns the worker, or
(when the job's state outlives the driver) starts it detached and relays its output files
(see `ssh_detached.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import sys
from asyncio.subprocess import Process
from dataclasses import dataclass

from elastic.driver.errors import LaunchError
from elastic.driver.launch.launcher import (
    OUTPUT_LIMIT,
    Adoption,
    HostFolder,
    Launcher,
    SubprocessWorker,
    WorkerProcess,
    WorkerSpec,
)
from elastic.driver.launch.ssh_detached import HEADER_GRACE, OpenAttach, RemoteDetachedProcess

# The remote login provides these itself; forwarding the driver's values would be wrong there.
_NOT_FORWARDED = re.compile(
    r"^(HOME|USER|LOGNAME|SHELL|PWD|OLDPWD|SHLVL|HOSTNAME|_|TERM|DISPLAY|XAUTHORITY|MAIL"
    r"|SSH_.*|BASH_FUNC_.*)$"
)
AGENT_MODULE = "elastic.driver.launch.ssh_agent"
# A session to a host that vanished without a word (no RST, no FIN) ends after about
# SERVER_ALIVE_INTERVAL * SERVER_ALIVE_COUNT seconds of silence.
SERVER_ALIVE_INTERVAL = 5
SERVER_ALIVE_COUNT = 3


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    identity_file: str | None = None
    connect_timeout: float = 30.0
    python: str = sys.executable  # the remote Python that has elasticrun installed


def ssh_command(options: SshOptions, hostname: str, remote: str) -> list[str]:
    """The ssh client command: batch mode, no host-key prompt, no secret in it, ended by a
    silent server."""
    command = [
        "ssh",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR",
        "-o", f"ConnectTimeout={max(1, int(options.connect_timeout))}",
        "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL}",
        "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT}",
    ]  # fmt: skip
    if options.port is not None:
        command += ["-p", str(options.port)]
    if options.identity_file is not None:
        command += ["-i", options.identity_file]
    # `--`: whatever the host's name, ssh reads it as the destination, never as an option.
    return [*command, "--", hostname, remote]


def forwarded_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _NOT_FORWARDED.match(k)}


class SshProcess(SubprocessWorker):
    """A remote worker seen through its ssh client; control lines go to the agent's stdin."""

    @property
    def signal(self) -> int | None:
        """The remote agent exits 128+N when signal N ended the worker; a negative code is a
        signal that ended the ssh client itself."""
        code = self._process.returncode
        if code is not None and code < 0:
            return -code
        return code - 128 if code is not None and 128 < code < 160 else None

    def _tell(self, line: str, close: bool = False) -> None:
        stdin = self._process.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(OSError, RuntimeError):
            stdin.write(line.encode())
            if close:
                stdin.close()

    def terminate(self) -> None:
        self._tell("TERM\n")

    def kill(self) -> None:
        """SIGKILL the remote worker, then drop the connection (the agent ends with it)."""
        self._tell("KILL\n", close=True)
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
            asyncio.get_running_loop().call_later(2.0, self._kill_client)

    def _kill_client(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()


def _no_ssh_client(hostname: str, err: OSError) -> str:
    return f"cannot run the ssh client for host {hostname}: {err.strerror or err}"


class SshLauncher(Launcher):
    """`Launcher` over ssh (see `Launcher` for the contract): starts workers owned by the
    agent's session (`SshProcess`), or, for a spec with a `host_folder`, detached
    (`RemoteDetachedProcess`); re-adopts detached ones."""

    def __init__(self, options: SshOptions, grace: float) -> None:
        self._options = options
        self._grace = grace

    async def check_reachable(self, hostname: str, timeout: float) -> None:
        command = ssh_command(self._options, hostname, "true")
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchError(_no_ssh_client(hostname, err)) from None
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise LaunchError(
                f"host {hostname} is unreachable through ssh: no answer within {timeout:g} s "
                "(--start-timeout)"
            ) from None
        if process.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines() or [
                f"ssh exited with {process.returncode}"
            ]
            raise LaunchError(f"host {hostname} is unreachable through ssh: {lines[-1]}")

    async def launch(self, spec: WorkerSpec) -> WorkerProcess:
        """Start the agent; raises `LaunchError` when the ssh client cannot run. Never waits
        for the host: a failure there is the worker's exit (ssh's 255, the agent's 126)."""
        remote = " ".join(
            [
                "cd",
                shlex.quote(spec.cwd),
                "&&",
                "exec",
                shlex.quote(self._options.python),
                "-m",
                AGENT_MODULE,
                "--",
                *(shlex.quote(arg) for arg in spec.command),
            ]
        )
        process = await self._open(spec.hostname, remote)
        header: dict = {"env": forwarded_env(spec.env), "grace": self._grace}
        if spec.host_folder is not None:
            header["detach"] = {
                "job_id": spec.host_folder.job_id,
                "serial": spec.host_folder.serial,
                "slot": spec.host_folder.slot,
            }
        assert process.stdin is not None
        process.stdin.write((json.dumps(header) + "\n").encode())
        if spec.host_folder is None:
            return SshProcess(process)
        return RemoteDetachedProcess(
            spec.hostname,
            self._attacher(spec.hostname, spec.host_folder),
            session=process,
            offsets={},
            header_timeout=self._options.connect_timeout + HEADER_GRACE,
            located=spec.located,
        )

    def adopt(self, adoption: Adoption) -> WorkerProcess:
        """Attach to the detached worker again through ssh (see `RemoteDetachedProcess`); the
        first attach session also stops the job's stray keepers on that host."""
        strays = (adoption.last_serial, adoption.adopted_here)
        return RemoteDetachedProcess(
            adoption.hostname,
            self._attacher(adoption.hostname, adoption.host_folder, strays),
            session=None,
            offsets=adoption.offsets,
            header_timeout=self._options.connect_timeout + HEADER_GRACE,
            located=adoption.located,
            keeper=adoption.pid,
        )

    def _attacher(
        self, hostname: str, folder: HostFolder, strays: tuple[int, frozenset[int]] | None = None
    ) -> OpenAttach:
        """Opens attach sessions to the worker in `folder` on `hostname`; the first one is
        given `strays` (keepers numbered up to this that are not these are stopped)."""

        async def open_attach(offsets: dict[str, int], keeper: int | None) -> Process:
            nonlocal strays
            args = [
                "--attach", folder.job_id, str(folder.serial),
                "--offsets", f"{offsets['stdout']},{offsets['stderr']}",
            ]  # fmt: skip
            if keeper:
                args += ["--keeper", str(keeper)]
            if strays is not None:
                upto, adopted = strays
                args += ["--strays-upto", str(upto), "--adopted", ",".join(map(str, adopted))]
                strays = None
            python = shlex.quote(self._options.python)
            remote = " ".join(["exec", python, "-m", AGENT_MODULE, *map(shlex.quote, args)])
            return await self._open(hostname, remote)

        return open_attach

    async def _open(self, hostname: str, remote: str) -> Process:
        """An ssh session running `remote` on `hostname`, its three streams piped."""
        try:
            return await asyncio.create_subprocess_exec(
                *ssh_command(self._options, hostname, remote),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=OUTPUT_LIMIT,
                env=os.environ.copy(),
            )
        except OSError as err:
            raise LaunchError(_no_ssh_client(hostname, err)) from None
