"""A real `sshd` on loopback for the ssh launcher's tests.

Use it from a test module with `pytest_plugins = ["tests.sshd"]` and a parameter named `sshd`.
The server runs as the current user, on a free port of 127.0.0.1 and 127.0.0.2 (127.0.0.2
routes to loopback but is no interface's address, so `elasticrun` reaches it through ssh),
with a throwaway host key and client key pair. Logins run this interpreter's `elastic`
package: `PYTHONPATH` points at it, whether or not it is installed. Their `TMPDIR` is a folder
of the server's own (`SshServer.tmpdir`), as another host's would differ from the driver's.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import elastic

SSHD = Path("/usr/sbin/sshd")
ADDRESSES = ("127.0.0.1", "127.0.0.2")
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


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
        return [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
            "-p", str(self.port),
            "-i", str(self.identity_file),
            host,
            *remote,
        ]  # fmt: skip


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


def _answers(address: str, port: int) -> bool:
    """True when an SSH server sends its banner on address:port."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as conn:
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "elasticrun-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )


def _config(directory: Path, port: int) -> str:
    package_root = Path(elastic.__file__).resolve().parent.parent
    return "\n".join(
        [
            f"Port {port}",
            *(f"ListenAddress {address}" for address in ADDRESSES),
            f"HostKey {directory / 'host_key'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            f"PidFile {directory / 'sshd.pid'}",
            f"AllowUsers {getpass.getuser()}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "PrintMotd no",
            "LogLevel VERBOSE",
            f"SetEnv PYTHONPATH={package_root} TMPDIR={directory / 'tmp'}",
            "",
        ]
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running_sshd(directory: Path) -> Iterator[SshServer]:
    """Start sshd with its keys and config in `directory`; stop it (by its PID) on exit."""
    _keygen(directory / "host_key")
    _keygen(directory / "id_ed25519")
    (directory / "authorized_keys").write_bytes((directory / "id_ed25519.pub").read_bytes())
    (directory / "id_ed25519").chmod(0o600)
    if os.geteuid() == 0:
        # Privilege separation needs its (empty) chroot directory.
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    port = _free_port()
    (directory / "tmp").mkdir(mode=0o700, exist_ok=True)
    (directory / "sshd_config").write_text(_config(directory, port))
    log = directory / "sshd.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(directory / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        waiting = list(ADDRESSES)
        while waiting:
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited with {process.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not listen within {START_TIMEOUT:g} s")
            if _answers(waiting[0], port):
                waiting.pop(0)
            else:
                time.sleep(0.05)  # polling the port: the deadline above bounds it
        server = SshServer(port, directory / "id_ed25519", process.pid, log, directory / "tmp")
        # A login must run this interpreter with the package importable, as the launcher does.
        check = subprocess.run(
            server.ssh_command(ADDRESSES[1], sys.executable, "-c", "'import elastic'"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        if check.returncode != 0:
            raise RuntimeError(
                f"ssh login to sshd failed ({check.returncode}): "
                f"{check.stderr.decode(errors='replace')}\n{log.read_text()}"
            )
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running sshd for this module's tests (skipped where openssh-server is missing)."""
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing (install Debian's openssh-server)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing (install Debian's openssh-client)")
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server
