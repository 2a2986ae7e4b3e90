"""The launcher's settings, validated, as the rest of the driver sees them."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.launch.ssh import SshOptions
from elastic.protocol.etcd import EtcdOptions


@dataclass(frozen=True)
class ElasticSettings:
    """Present when the job is elastic (a discovery script or `--min-np` was given)."""

    min_np: int
    max_np: int | None  # None: every usable slot
    discovery_script: str | None  # None: the fixed hosts of -H / --hostfile
    slots_per_host: int | None = None
    discovery_interval: float = 1.0
    discovery_timeout: float = 10.0
    elastic_timeout: float = 600.0
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] = (5.0, 300.0)


@dataclass(frozen=True)
class BackendSettings:
    """Where the job's state lives. Not saved with the job: each driver gets its own."""

    etcd: EtcdOptions | None = None  # None: in the driver's memory
    job_id: str | None = None  # None: a new job with a fresh id
    grace: float = 60.0  # seconds of etcd outage before the driver says so loudly
    driver_wait: float = 300.0  # seconds workers wait for a restarted driver

    @property
    def durable(self) -> bool:
        return self.etcd is not None


@dataclass(frozen=True)
class Settings:
    np: int | None  # initial number of workers; None in elastic mode means every usable slot
    hosts: list[HostSpec]
    command: list[str]
    ssh: SshOptions = field(default_factory=SshOptions)
    output_dir: str | None = None
    start_timeout: float = 30.0
    network_interface: str | None = None
    verbose: bool = False
    stop_grace: float = 5.0
    collective_timeout: float = 1800.0
    heartbeat_interval: float = 1.0
    tls: bool = False  # HTTPS and TLS gRPC; workers pin the driver's certificate
    tls_cert: str | None = None  # PEM files; with `tls` and none given: self-signed per job
    tls_key: str | None = None
    elastic: ElasticSettings | None = None
    backend: BackendSettings = field(default_factory=BackendSettings)
