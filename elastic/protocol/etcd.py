"""The etcd side of the protocol: how to connect, and where a job's keys live.

Driver and workers both read this: the driver keeps its job state under the job's prefix, and
publishes its address there so that workers find a restarted driver.

Layout under `<prefix>/<job_id>/` (etcd may be readable, even writable, by others: nothing
here is secret, and what a driver or worker acts on carries a MAC under a key derived from the
job token, `elastic.protocol.etcd_trust`):
  lock         the driver that runs the job (attached to its lease: gone when the driver is)
  driver       that driver's addresses, a `DriverAddress` with its MAC (attached to the same
               lease); with TLS also its certificate (public)
  spec         the job's settings (what to run, where, with which limits)
  spec_mac     `document_mac` of `spec`
  state        round, members, worker registry, cooldowns, counters
  state_mac    `document_mac` of `state`, written in the same transaction as `state`
  token_check  `token_check` of the job's token: a restarted driver tells a wrong token from a
               changed document (it reveals nothing about the token)
  result       the job's exit code and message, once it ended
  secret       only in jobs saved by versions before the MACs: the token in clear. Never
               written now; a driver refuses to take such a job up (see `docs/security.md`).
No TLS private key and no token is stored anywhere in etcd.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import grpc
from pydantic import BaseModel

from elastic.errors import ElasticError
from elastic.protocol.etcd_trust import document_authentic, document_mac

DEFAULT_PREFIX = "/elasticrun"
SEALED = ("spec", "state")
"""The documents a restarted driver acts on: each is saved with its MAC, `mac_key(name)`."""
KEY_NAMES = (
    "lock", "driver", "spec", "spec_mac", "state", "state_mac", "token_check", "result",
    "secret",
)  # fmt: skip
LEGACY_SECRET = "secret"


def mac_key(name: str) -> str:
    """The key that holds the MAC of document `name` (one of `SEALED`)."""
    return f"{name}_mac"


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

    Makes no call unless user and password are set: then it logs in, which raises
    `grpc.RpcError` (see `refusal`) or pyetcd's ConnectionFailedError. The login's token is
    sent as call metadata, over TLS or not (pyetcd's call credentials would need TLS). etcd
    forgets a login left idle for its `--auth-token-ttl` (5 min by default) or lost in a
    restart: a call then fails with UNAUTHENTICATED (`login_expired`) and the caller makes a
    new client. A failed endpoint is tried again after 1 s, not pyetcd's default 300 s, so a
    restarted etcd is used again at once.
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
    client = pyetcd.MultiEndpointEtcd3Client(
        endpoints,
        timeout=options.call_timeout,
        user=options.user,
        password=options.password,
        failover=True,
    )
    client.call_credentials = None  # the login travels in `client.metadata`
    return client


class EtcdRefused(ElasticError):
    """etcd refused this client: a wrong user or password, a user without access to the job's
    keys. Retrying does not help; the message (one line) says what to change."""


def _code_and_details(err: BaseException) -> tuple[grpc.StatusCode | None, str]:
    if not isinstance(err, grpc.RpcError):
        return None, ""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else ""
    return code, details or ""


def login_expired(err: BaseException) -> bool:
    """Whether etcd refused a call because it forgot this client's login (idle past its
    `--auth-token-ttl`, or restarted): a new client logs in again."""
    code, _ = _code_and_details(err)
    return code == grpc.StatusCode.UNAUTHENTICATED


def refusal(err: BaseException, options: EtcdOptions) -> EtcdRefused | None:
    """`err` as an `EtcdRefused` naming what to change, or None when it is no refusal (an
    outage, an expired login: retry)."""
    code, details = _code_and_details(err)
    user = f"user {options.user!r}" if options.user else None
    if code == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
        return EtcdRefused(
            f"etcd refused {user or 'the login'}: wrong user name or password (--etcd-user; "
            "the password from --etcd-password-file or $ELASTICRUN_ETCD_PASSWORD)"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in details:
        return EtcdRefused(
            "etcd has authentication on: give --etcd-user (its password in "
            "--etcd-password-file or $ELASTICRUN_ETCD_PASSWORD), or a client certificate "
            "(--etcd-cert, --etcd-key) whose common name is an etcd user"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        who = user or (
            "the user named by the client certificate" if options.cert else "this client"
        )
        return EtcdRefused(
            f"etcd denied {who} access to the keys under {options.prefix.rstrip('/')}/: give "
            "its role read and write on that prefix (workers and `elasticrun status` need read)"
        )
    return None


class AddressNotAuthentic(ElasticError, ValueError):
    """A driver address in etcd whose MAC does not verify with the job token: someone other
    than the job's driver wrote it (or the token is not this job's)."""


class DriverAddress(BaseModel):
    """Where the driver that runs a job serves; published under the job's `driver` key.

    With TLS it also carries the certificate the driver presents (PEM, public). `mac` is the
    `document_mac` of every other field under the job token (`signed`): etcd may be readable,
    even writable, by others, so a worker (or `elasticrun status`) moves to a published
    address, sends its token there and pins a published certificate only when the MAC
    verifies (`verified`). No private key is ever published.
    """

    driver_id: str
    url: str
    control_address: str
    host: str
    pid: int
    tls_cert: str | None = None
    mac: str | None = None

    def _signed_bytes(self) -> bytes:
        fields = self.model_dump(mode="json", exclude={"mac"})
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, token: str, job_id: str) -> DriverAddress:
        """This address with its MAC under `token`, for job `job_id`."""
        mac = document_mac(token, job_id, "driver", self._signed_bytes())
        return self.model_copy(update={"mac": mac})

    def verified(self, token: str, job_id: str) -> DriverAddress:
        """This address, once its MAC verifies with `token` for job `job_id`.

        Raises `AddressNotAuthentic` when the MAC is missing or does not verify (a document
        someone other than the job's driver wrote, or a driver of an older version)."""
        if not document_authentic(token, job_id, "driver", self._signed_bytes(), self.mac):
            raise AddressNotAuthentic(
                f"the driver address published for job {job_id} ({self.url}) is not signed "
                "with this job's token"
            )
        return self

    @property
    def cert_pem(self) -> bytes | None:
        """The published certificate (PEM), or None; trust it only from a `verified` address."""
        return self.tls_cert.encode() if self.tls_cert is not None else None
