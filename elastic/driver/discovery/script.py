"""Discovery by a user's script (`--host-discovery-script`), as in horovodrun.

The script prints the available hosts, one a line: `hostname` or `hostname:slots` (blank lines
and `#` comments are ignored; IPv6 addresses in brackets: `[fd00::1]:4`), optionally followed
by a preemption notice, ` leaving` or ` leaving=T` (`hosts.split_notice`). A host printed
without a slot count gets `default_slots` (`--slots-per-host`), or 1 when that is not given;
a count above `MAX_SLOTS_PER_HOST` fails the run like any malformed line.
The script runs with the driver's environment and working directory, without a shell, in its
own session (process group), with stdin closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
from dataclasses import replace

from elastic.driver.discovery.host_discovery import DiscoveryError, HostDiscovery
from elastic.driver.discovery.hosts import (
    MAX_SLOTS_PER_HOST,
    HostSpec,
    parse_host_lines,
    split_notice,
)
from elastic.driver.errors import UsageError

_MAX_STDERR_LINE = 300
_DRAIN_SECONDS = 1.0


class ScriptDiscovery(HostDiscovery):
    """`HostDiscovery` by a script (see `HostDiscovery.find` for the contract): run `path`
    at every `find()` and parse what it prints.

    `path` is a file path; one without a `/` is looked up in the working directory first,
    then on PATH. The script must finish, and close its output, within `timeout` seconds.
    """

    def __init__(self, path: str, timeout: float, default_slots: int | None = None) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if default_slots is not None and not 1 <= default_slots <= MAX_SLOTS_PER_HOST:
            raise ValueError(f"default_slots must be 1-{MAX_SLOTS_PER_HOST}, got {default_slots}")
        self.path = path
        self.timeout = timeout
        self.default_slots = default_slots

    def check(self) -> str:
        """Return the program to run; raise `DiscoveryError` if it is missing, not a file, or
        not executable. `find()` checks again at every call (the file may change)."""
        path = self.path
        if "/" not in path and not os.path.exists(path):
            path = shutil.which(path) or path
        if not os.path.exists(path):
            raise DiscoveryError(f"discovery script {self.path} does not exist")
        if not os.path.isfile(path):
            raise DiscoveryError(f"discovery script {self.path} is not a file")
        if not os.access(path, os.X_OK):
            raise DiscoveryError(
                f"discovery script {self.path} is not executable (chmod +x {self.path})"
            )
        return path if "/" in path else os.path.join(os.curdir, path)

    async def find(self) -> list[HostSpec]:
        """Run the script once and return its hosts in the order printed.

        Raises `DiscoveryError` when the script is missing or cannot be run, exits non-zero
        (the message ends with its last stderr line), is killed by a signal, does not finish
        within the timeout (its whole process group is then killed with SIGKILL), or prints a
        malformed line or a host twice (the message names the line). If the call is
        cancelled, the script's process group is killed as well.
        """
        program = self.check()
        # Shielded: a cancel that lands while asyncio sets up the pipes would make asyncio
        # kill only the script and wait for it (stuck while a child holds its pipes). Let the
        # start finish, then kill the whole group.
        starting = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                program,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        )
        try:
            process = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                await _kill_and_reap(await starting)
            raise
        except OSError as err:
            hint = " (does it start with a #! line?)" if err.errno == errno.ENOEXEC else ""
            raise DiscoveryError(
                f"discovery script {self.path} cannot be run: {err.strerror}{hint}"
            ) from None
        try:
            async with asyncio.timeout(self.timeout):
                stdout, stderr = await process.communicate()
        except TimeoutError:
            await _kill_and_reap(process)
            raise DiscoveryError(
                f"discovery script {self.path} did not finish within {self.timeout:g} s "
                "(--discovery-timeout)"
            ) from None
        except asyncio.CancelledError:
            await _kill_and_reap(process)
            raise
        except BaseException:
            _kill_group(process.pid)
            raise
        code = process.returncode
        if code != 0:
            raise DiscoveryError(self._exit_message(code, stderr))
        return self._parse(stdout.decode(errors="replace"))

    def _exit_message(self, code: int | None, stderr: bytes) -> str:
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        lines = [line.strip() for line in stderr.decode(errors="replace").splitlines()]
        last = next((line for line in reversed(lines) if line), None)
        if last is None:
            return f"discovery script {self.path} {how} (nothing on stderr)"
        if len(last) > _MAX_STDERR_LINE:
            last = last[:_MAX_STDERR_LINE] + "..."
        return f"discovery script {self.path} {how}: {last}"

    def _parse(self, text: str) -> list[HostSpec]:
        try:
            where = f"discovery script {self.path} output"
            specs = parse_host_lines(text, where, notices=True)
        except UsageError as err:
            raise DiscoveryError(str(err)) from None
        if self.default_slots is None:
            return specs
        # A line that is just the host's name (bracketed for IPv6; a notice may follow) gave
        # no slot count. Names are unique (parse_host_lines rejects repeats), so a name
        # identifies its line.
        entries = (split_notice(line.split("#", 1)[0], where)[0] for line in text.splitlines())
        bare = {entry.strip().strip("[]") for entry in entries}
        return [
            replace(spec, slots=self.default_slots) if spec.hostname in bare else spec
            for spec in specs
        ]


async def _kill_and_reap(process: asyncio.subprocess.Process) -> None:
    """Kill the script's process group, wait for the script to be gone, and read its pipes to
    their end so that they are closed (for at most `_DRAIN_SECONDS`: a process that left the
    group with `setsid` may still hold them; they close when it exits)."""
    _kill_group(process.pid)
    await process.wait()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_DRAIN_SECONDS):
            await process.communicate()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group that `pid` leads (the script and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
