"""The launcher's settings, validated, as the rest of the driver sees them."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic.driver.hosts import HostSpec
from elastic.driver.launch.ssh import SshOptions


@dataclass(frozen=True)
class Settings:
    np: int
    hosts: list[HostSpec]
    command: list[str]
    ssh: SshOptions = field(default_factory=SshOptions)
    output_dir: str | None = None
    start_timeout: float = 30.0
    network_interface: str | None = None
    verbose: bool = False
    stop_grace: float = 5.0
    collective_timeout: float = 1800.0
