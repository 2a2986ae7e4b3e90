"""The etcd side of the protocol: how to connect, and where a job's keys live.

Driver and workers both read this: the driver keeps its job state under the job's prefix, and
publishes its address there so that workers find a restarted driver.

Layout under `<prefix>/<job_id>/`:
  lock     the driver that runs the job (attached to its lease: gone when the driver is)
  driver   that driver's addresses, a `DriverAddress` (attached to the same lease)
  spec     the job's settings (what to run, where, with which limits)
  secret   the job token (and TLS identity): never printed, never in `/v1/status`
  state    epoch, members, worker registry, cooldowns, counters
  result   the job's exit code and message, once it ended
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import BaseModel

DEFAULT_PREFIX = "/elasticrun"
KEY_NAMES = ("lock", "driver", "spec", "secret", "state", "result")


class EtcdConfigError(ValueError):
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
    password: str | None = None
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


class DriverAddress(BaseModel):
    """Where the driver that runs a job serves; published under the job's `driver` key."""

    driver_id: str
    url: str
    control_address: str
    host: str
    pid: int
