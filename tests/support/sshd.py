"""A real `sshd` on loopback for the ssh launcher's tests.

Use it from a test module with `pytest_plugins = ["tests.support.sshd"]` and a parameter named
`sshd`.
The server runs as the current user, on a free port of 127.0.0.1 and 127.0.0.2 (127.0.0.2
routes to loopback but is no interface's address, so `elasticrun` reaches it through ssh),
with a throwaway host key and client key pair (tests/support/sshd_server.py). Logins run this
interpreter's `elastic` package: `PYTHONPATH` points at it, whether or not it is installed.
Their `TMPDIR` is a folder of the server's own (`SshServer.tmpdir`), as another host's would
differ from the driver's.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.sshd_server import (
    check_login,
    make_keys,
    missing_ssh_tools,
    ssh_command,
    sshd_config,
    start_sshd,
    stop_sshd,
    wait_listening,
)

ADDRESSES = ("127.0.0.1", "127.0.0.2")


@dataclass(frozen=True)
class SshServer:
    """A running sshd: where it listens, the key that logs in, and its log."""

    port: int
    identity_file: Path
    pid: int
    log: Path
    tmpdir: Path  # the logins' $TMPDIR
    addresses: tuple[str, ...] = ADDRESSES

    def elasticrun_args(self) -> list[str]:
        """The `elasticrun` flags that reach this server: `-p PORT -i KEY`."""
        return ["-p", str(self.port), "-i", str(self.identity_file)]

    def ssh_command(self, host: str, *remote: str) -> list[str]:
        """An ssh client command to `host` through this server (no prompt, no known_hosts)."""
        return ssh_command(self.port, self.identity_file, host, *remote)


def _free_port() -> int:
    """A TCP port free on every address in ADDRESSES (sshd binds it on all of them)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            port = probe.getsockname()[1]
        try:
            for address in ADDRESSES:
                with socket.socket() as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no TCP port free on all of {ADDRESSES}")


@contextlib.contextmanager
def running_sshd(directory: Path) -> Iterator[SshServer]:
    """Start sshd with its keys and config in `directory`; stop it (by its PID) on exit."""
    keys = make_keys(directory)
    port = _free_port()
    config = directory / "sshd_config"
    tmpdir = directory / "tmp"
    tmpdir.mkdir(mode=0o700, exist_ok=True)
    config.write_text(sshd_config(keys, ADDRESSES, port, directory / "sshd.pid", tmpdir))
    log = directory / "sshd.log"
    process = start_sshd(config, log)
    try:
        wait_listening(process, ADDRESSES, port, log)
        check_login(port, keys.identity_file, ADDRESSES[1], log)
        yield SshServer(port, keys.identity_file, process.pid, log, tmpdir)
    finally:
        stop_sshd(process)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running sshd for this module's tests (skipped where openssh-server is missing)."""
    if reason := missing_ssh_tools():
        pytest.skip(reason)
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server
