"""The etcd side of the protocol: how to connect, and where a job's keys live.

Driver and workers both read this: the driver keeps its job state under the job's prefix, and
publishes its address there so that workers find a restarted driver.

Layout under `<prefix>/<job_id>/`:
  lock     the driver that runs the job (attached to its lease: gone when the driver is)
  driver   that driver's addresses, a `DriverAddress` (attached to the same lease), with TLS
           its certificate (public) and that certificate's MAC under the job token
  spec     the job's settings (what to run, where, with which limits)
  secret   the job token: never printed, never in `/v1/status` (no TLS private key is
           stored anywhere in etcd)
  state    epoch, members, worker registry, cooldowns, counters
  result   the job's exit code and message, once it ended
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field

from pydantic import BaseModel

from elastic.errors import ElasticError

DEFAULT_PREFIX = "/elasticrun"
KEY_NAMES = ("lock", "driver", "spec", "secret", "state", "result")
_MAC_LABEL = b"elasticrun driver certificate\0"  # the token is also a bearer secret: a label


class EtcdConfigError(ElasticError, ValueError):
    """The etcd options are malformed (an endpoint that is not host:port, a missing file)."""


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach etcd. `password` is read from the environment, never a command line."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX
    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a log line
    call_timeout: float = 2.0  # seconds one etcd call may take

    def job_key(self, job_id: str, name: str) -> str:
        """The key `name` (one of `KEY_NAMES`) of job `job_id`."""
        return f"{self.prefix.rstrip('/')}/{job_id}/{name}"


def parse_endpoints(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port[,host:port...]` (an `http://` scheme is accepted and dropped)."""
    endpoints = []
    for item in text.split(","):
        item = item.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EtcdConfigError(f"etcd endpoint {item!r} is not host:port")
        endpoints.append((host, int(port)))
    return tuple(endpoints)


def connect(options: EtcdOptions):  # noqa: ANN201 - pyetcd has no type hints
    """A pyetcd client over every endpoint, failing over between them.

    Makes no call unless user and password are set (then it authenticates, which may raise
    pyetcd's ConnectionFailedError). A failed endpoint is tried again after 1 s, not pyetcd's
    default 300 s, so a restarted etcd is used again at once.
    """
    import pyetcd
    from pyetcd.client import Endpoint

    for path in (options.ca_cert, options.cert, options.key):
        if path is not None and not os.path.isfile(path):
            raise EtcdConfigError(f"no such file: {path}")
    credentials = None
    if options.ca_cert is not None:
        credentials = pyetcd.MultiEndpointEtcd3Client.get_secure_creds(
            options.ca_cert, options.key, options.cert
        )
    grpc_options = [("grpc.max_reconnect_backoff_ms", 1000)]
    endpoints = [
        Endpoint(
            host,
            port,
            secure=credentials is not None,
            creds=credentials,
            time_retry=1.0,
            opts=grpc_options,
        )
        for host, port in options.endpoints
    ]
    return pyetcd.MultiEndpointEtcd3Client(
        endpoints,
        timeout=options.call_timeout,
        user=options.user,
        password=options.password,
        failover=True,
    )


class CertificateNotAuthentic(ElasticError, ValueError):
    """A certificate published in etcd whose MAC does not verify with the job token."""


def certificate_mac(token: str, cert_pem: bytes) -> str:
    """HMAC-SHA256 of `cert_pem` keyed by the job token, hex. Only holders of the token (the
    driver and its workers) can make it; it reveals nothing about the token."""
    return hmac.new(token.encode(), _MAC_LABEL + cert_pem, hashlib.sha256).hexdigest()


class DriverAddress(BaseModel):
    """Where the driver that runs a job serves; published under the job's `driver` key.

    With TLS it also carries the certificate the driver presents (PEM, public) and
    `tls_cert_mac`, its `certificate_mac` under the job token: etcd may be readable, even
    writable, by others, so a worker pins a published certificate only when the MAC
    verifies with the token it holds (`verified_cert`). No private key is ever published.
    """

    driver_id: str
    url: str
    control_address: str
    host: str
    pid: int
    tls_cert: str | None = None
    tls_cert_mac: str | None = None

    def verified_cert(self, token: str) -> bytes | None:
        """The published certificate (PEM), or None when none is published.

        Raises `CertificateNotAuthentic` when its MAC is missing or does not verify with
        `token` (a certificate someone other than the job's driver put there).
        """
        if self.tls_cert is None:
            return None
        expected = certificate_mac(token, self.tls_cert.encode())
        if not token or not hmac.compare_digest(expected, self.tls_cert_mac or ""):
            raise CertificateNotAuthentic(
                f"the certificate published for the driver at {self.url} is not signed with "
                "this job's token"
            )
        return self.tls_cert.encode()
