"""The launcher's settings, validated, as the rest of the driver sees them.

Each class checks its values when it is built (by the CLI, by a restarted driver from the saved
job, by a benchmark) and raises `SettingsError` naming the flag of the first bad one. What
needs the world (files, hosts, the discovery script) is checked by the CLI.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from elastic.driver.discovery.cooldown import validate_cooldown_range
from elastic.driver.discovery.hosts import MAX_SLOTS_PER_HOST, HostSpec
from elastic.driver.errors import SettingsError, seconds
from elastic.driver.journal.job_token import GivenToken
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.logs import LOG_FORMATS
from elastic.driver.server.host_check import check_allowed_host
from elastic.protocol.env import ETCD_PASSWORD, CheckpointSettings
from elastic.protocol.etcd import EtcdOptions

MAX_NP = 65_536
"""The most workers a job may ask for (-np, --min-np, --max-np)."""
DEFAULT_WORKER_HISTORY = 32
"""Ended workers whose records a job keeps, the newest (--worker-history)."""
MAX_WORKER_HISTORY = 100_000
"""The most ended workers whose records a job may keep (--worker-history)."""

_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _count(value: int | None, flag: str, most: int) -> None:
    """Raise `SettingsError` unless `value` (a worker or slot count) is None or 1 to `most`."""
    if value is not None and value < 1:
        raise SettingsError(f"{flag} must be at least 1, got {value}")
    if value is not None and value > most:
        raise SettingsError(f"{flag} must be at most {most}, got {value}")


DEFAULT_STANDBY = 0  # off: a standby costs a busy host while it starts (docs/launcher.md)
MAX_STANDBY = 64
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class FailureScope(enum.StrEnum):
    """What a failed worker takes out of an elastic job with it (--failure-scope)."""

    HOST = "host"  # its host: the host's other workers leave too (horovodrun's blacklist)
    WORKER = "worker"  # itself alone: its host's other workers go on


class Rollback(enum.StrEnum):
    """How far the survivors go back when a peer dies (--rollback)."""

    STEP = "step"  # to the newest step every survivor, or one of them, holds consistently
    COMMIT = "commit"  # to the last commit, always


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
    failure_scope: FailureScope = FailureScope.HOST
    rollback: Rollback = Rollback.STEP
    standby: int = DEFAULT_STANDBY  # warm standbys per host (--standby; 0: none)
    preload: tuple[str, ...] = ()  # modules the standbys import (--preload)

    def __post_init__(self) -> None:
        """Raise `SettingsError` for a count out of range, a duration that is not a finite
        number of seconds, a bad cooldown range, a --max-np below --min-np, or a --preload
        entry that is not a module name."""
        _count(self.min_np, "--min-np", MAX_NP)
        _count(self.max_np, "--max-np", MAX_NP)
        _count(self.slots_per_host, "--slots-per-host", MAX_SLOTS_PER_HOST)
        seconds(self.elastic_timeout, "--elastic-timeout")
        seconds(self.discovery_interval, "--discovery-interval")
        seconds(self.discovery_timeout, "--discovery-timeout")
        for value in self.cooldown_range:
            seconds(value, "--blacklist-cooldown-range", zero=True)
        validate_cooldown_range(*self.cooldown_range)
        if self.max_np is not None and self.max_np < self.min_np:
            raise SettingsError(f"--max-np {self.max_np} is less than --min-np {self.min_np}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise SettingsError(f"--reset-limit must be 0 or more, got {self.reset_limit}")
        if not 0 <= self.standby <= MAX_STANDBY:
            raise SettingsError(f"--standby must be 0 to {MAX_STANDBY}, got {self.standby}")
        for name in self.preload:
            if not _MODULE.fullmatch(name):
                raise SettingsError(f"--preload: {name!r} is not a module name (a.b.c)")


@dataclass(frozen=True)
class BackendSettings:
    """Where the job's state lives. Not saved with the job: each driver gets its own."""

    etcd: EtcdOptions | None = None  # None: in the driver's memory
    job_id: str | None = None  # None: a new job with a fresh id
    grace: float = 60.0  # seconds of etcd outage before the driver says so loudly
    driver_wait: float = 300.0  # seconds workers wait for a restarted driver
    token: GivenToken | None = field(default=None, repr=False)  # --token-file, $ELASTICRUN_TOKEN

    def __post_init__(self) -> None:
        """Raise `SettingsError` for a job id that is not 1-64 letters, digits, '.', '_' or
        '-', a duration out of range, or etcd options that do not fit together."""
        if self.job_id is not None and not _JOB_ID.fullmatch(self.job_id):
            raise SettingsError(
                f"--job-id {self.job_id!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        etcd = self.etcd
        if etcd is not None and (etcd.cert is None) != (etcd.key is None):
            raise SettingsError("--etcd-cert and --etcd-key go together")
        if etcd is not None and etcd.user is not None and not etcd.password:
            raise SettingsError(
                "--etcd-user needs its password: --etcd-password-file FILE or "
                f"$ELASTICRUN_ETCD_PASSWORD (or ${ETCD_PASSWORD})"
            )
        if etcd is not None and not etcd.prefix.startswith("/"):
            raise SettingsError(f"--etcd-prefix must start with '/', got {etcd.prefix!r}")
        seconds(self.grace, "--etcd-grace")
        seconds(self.driver_wait, "--driver-wait")

    @property
    def durable(self) -> bool:
        return self.etcd is not None


@dataclass(frozen=True)
class Settings:
    np: int | None  # static: the workers; elastic: slots to wait for (None: --min-np)
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
    allowed_hosts: tuple[str, ...] = ()  # --allowed-hosts: more names the HTTP port answers to
    elastic: ElasticSettings | None = None
    backend: BackendSettings = field(default_factory=BackendSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    preemption_check: str = ""  # a command the workers run; it prints when their host goes
    preemption_check_interval: float = 5.0
    stall_warning: float = 60.0  # seconds ranks wait in one collective before a stall line
    stall_timeout: float | None = None  # seconds after which the ranks behind have failed
    log_format: str = "text"  # the launcher's lines: "text" for people, "json" a line each
    worker_history: int = DEFAULT_WORKER_HISTORY  # ended workers whose records are kept

    def __post_init__(self) -> None:
        """Raise `SettingsError` for no command, no -np outside elastic mode, a count or
        duration out of range, an -np outside --min-np..--max-np, half a TLS identity, or an
        --allowed-hosts entry that is not a host name or address."""
        if not self.command:
            raise SettingsError("no command given: elasticrun -np N [options] COMMAND [ARGS...]")
        _count(self.np, "-np", MAX_NP)
        seconds(self.start_timeout, "--start-timeout")
        seconds(self.collective_timeout, "--collective-timeout")
        seconds(self.stop_grace, "--stop-grace")
        seconds(self.heartbeat_interval, "--heartbeat-interval")
        seconds(self.preemption_check_interval, "--preemption-check-interval")
        seconds(self.stall_warning, "--stall-warning")
        if self.stall_timeout is not None:
            seconds(self.stall_timeout, "--stall-timeout")
        if self.preemption_check and self.elastic is None:
            raise SettingsError("--preemption-check needs elastic mode (--min-np or discovery)")
        if self.ssh.port is not None and not 0 < self.ssh.port < 65536:
            raise SettingsError(f"--ssh-port must be 1-65535, got {self.ssh.port}")
        elastic = self.elastic
        if self.np is None and elastic is None:
            raise SettingsError("-np is required (or give --min-np / --host-discovery-script)")
        if elastic is not None and self.np is not None:  # both counts are in range by now
            low, high = elastic.min_np, elastic.max_np or self.np
            if not low <= self.np <= high:
                raise SettingsError(f"-np {self.np} must lie between --min-np and --max-np")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingsError("--tls-cert and --tls-key go together")
        for entry in self.allowed_hosts:
            try:
                check_allowed_host(entry)
            except ValueError as err:
                raise SettingsError(f"--allowed-hosts: {err}") from None
        if not 0 <= self.worker_history <= MAX_WORKER_HISTORY:
            raise SettingsError(
                f"--worker-history must be 0 to {MAX_WORKER_HISTORY}, got {self.worker_history}"
            )
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(
                f"--log-format must be {' or '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
