"""A throwaway `sshd`: its keys, its config, starting it and waiting for its banner.

Shared by the loopback sshd fixture (tests/support/sshd.py) and the multi-host bed
(tests/multihost/bed.py), which runs one per network namespace. No pytest here: bench scripts
import the bed too.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import elastic
from tests.support.prerequisites import SSHD, Machine, missing_ssh

START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

CLIENT_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
)  # fmt: skip
"""ssh client options for a throwaway server: no prompt, no known_hosts, no noise."""


@dataclass(frozen=True)
class SshKeys:
    """A host key and a client key pair whose public half is the only authorized key."""

    directory: Path

    @property
    def host_key(self) -> Path:
        return self.directory / "host_key"

    @property
    def identity_file(self) -> Path:
        """The client's private key: `ssh -i` it."""
        return self.directory / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.directory / "authorized_keys"


def make_keys(directory: Path) -> SshKeys:
    """Generate a host key and a client key pair in `directory` (which must exist)."""
    keys = SshKeys(directory)
    for path in (keys.host_key, keys.identity_file):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "elasticrun-test",
             "-f", str(path)],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )  # fmt: skip
    keys.authorized_keys.write_bytes(keys.identity_file.with_suffix(".pub").read_bytes())
    keys.identity_file.chmod(0o600)
    return keys


def sshd_config(
    keys: SshKeys, addresses: Sequence[str], port: int, pid_file: Path, tmpdir: Path
) -> str:
    """An sshd_config that lets the current user in with `keys` only, on `addresses`:`port`.

    Logins get `PYTHONPATH` pointing at the `elastic` package this interpreter imports, so a
    remote command runs this checkout's code whether or not it is installed, and `TMPDIR`
    set to `tmpdir`: the host's own, as another machine's would be (remote workers keep their
    output there).
    """
    package_root = Path(elastic.__file__).resolve().parent.parent
    return "\n".join(
        [
            f"Port {port}",
            *(f"ListenAddress {address}" for address in addresses),
            f"HostKey {keys.host_key}",
            f"AuthorizedKeysFile {keys.authorized_keys}",
            f"PidFile {pid_file}",
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
            "UseDNS no",
            "LogLevel VERBOSE",
            f"SetEnv PYTHONPATH={package_root} TMPDIR={tmpdir}",
            "",
        ]
    )


def ssh_command(port: int, identity_file: Path, host: str, *remote: str) -> list[str]:
    """An ssh client command that runs `remote` on `host`:`port`, logging in with the key."""
    return ["ssh", *CLIENT_OPTIONS, "-p", str(port), "-i", str(identity_file), host, *remote]


def answers(address: str, port: int) -> bool:
    """True when an SSH server sends its banner on address:port."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as conn:
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def start_sshd(config: Path, log: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start `sshd -D` with `config` in a new session, its output in `log`; `prefix` runs it
    through a wrapper (`ip netns exec NS`) that must exec it, so the child is sshd itself."""
    if os.geteuid() == 0:
        # Privilege separation needs its (empty) chroot directory.
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(log, "ab") as log_file:
        return subprocess.Popen(
            [*prefix, str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_listening(
    process: subprocess.Popen[bytes], addresses: Sequence[str], port: int, log: Path
) -> None:
    """Return once sshd answers on every address; raise RuntimeError (with its log) if it
    exits first or does not answer within START_TIMEOUT seconds."""
    deadline = time.monotonic() + START_TIMEOUT
    waiting = list(addresses)
    while waiting:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not listen within {START_TIMEOUT:g} s")
        if answers(waiting[0], port):
            waiting.pop(0)
        else:
            time.sleep(0.05)  # polling the port: the deadline above bounds it


def check_login(port: int, identity_file: Path, host: str, log: Path) -> None:
    """Log in to `host`:`port` and import `elastic` with this interpreter, as the launcher's
    remote agent will; raise RuntimeError with ssh's complaint and sshd's `log` if that fails."""
    check = subprocess.run(
        ssh_command(port, identity_file, host, sys.executable, "-c", "'import elastic'"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    if check.returncode != 0:
        raise RuntimeError(
            f"ssh login to {host} failed ({check.returncode}): "
            f"{check.stderr.decode(errors='replace')}\n{log.read_text()}"
        )


def stop_sshd(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM sshd (by its PID), SIGKILL it after STOP_TIMEOUT seconds, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def missing_ssh_tools() -> str | None:
    """Why no throwaway sshd can run here (one line), or None when sshd, ssh and ssh-keygen
    are all there (tests/support/prerequisites.py)."""
    return missing_ssh(Machine.here())
