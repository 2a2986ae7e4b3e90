"""The launcher's settings, validated, as the rest of the driver sees them."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic.driver.hosts import HostSpec
from elastic.driver.launch.ssh import SshOptions


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
    elastic: ElasticSettings | None = None
