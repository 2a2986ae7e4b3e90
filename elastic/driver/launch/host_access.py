"""How the driver reaches each host: a local subprocess or ssh, checked once, and the address
its servers bind to."""

from __future__ import annotations

import asyncio
import logging

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.launch.base import Launcher
from elastic.driver.launch.detached import DetachedLauncher
from elastic.driver.launch.local import LocalLauncher
from elastic.driver.launch.network import interface_address, is_local, local_addresses, route_source
from elastic.driver.launch.ssh import SshLauncher, SshOptions

log = logging.getLogger("elasticrun")


class HostAccess:
    """Remembers, per host name, whether it is this machine and whether ssh to it works.

    A name that resolves to an address of this machine's interfaces is launched locally; any
    other through ssh, once `check_reachable` has seen ssh answer.
    """

    def __init__(
        self,
        ssh: SshOptions,
        stop_grace: float,
        ssh_timeout: float,
        detached: bool = False,
        *,
        local_launcher: Launcher | None = None,
        ssh_launcher: Launcher | None = None,
    ) -> None:
        """`local_launcher` and `ssh_launcher` replace the default ones (tests, benchmarks)."""
        self._addresses = local_addresses()
        self._local: dict[str, bool] = {}
        self._unresolvable: set[str] = set()
        self._reachable: set[str] = set()
        self._ssh_timeout = ssh_timeout
        self._detached = detached
        # Detached: local workers outlive the driver, under a keeper, output in files.
        self._local_launcher: Launcher = local_launcher or (
            DetachedLauncher() if detached else LocalLauncher()
        )
        self._ssh_launcher: Launcher = ssh_launcher or SshLauncher(ssh, stop_grace)

    def is_local(self, hostname: str) -> bool:
        """Raises `UsageError` for a name that does not resolve."""
        if hostname not in self._local:
            self._local[hostname] = is_local(hostname, self._addresses)
        return self._local[hostname]

    def detached(self, hostname: str) -> bool:
        """Whether workers on `hostname` outlive the driver, their output in files."""
        return self._detached and self.is_local(hostname)

    def usable(self, hostname: str) -> bool:
        """False for a (discovered) host name that does not resolve; logged once."""
        if hostname in self._unresolvable:
            return False
        try:
            self.is_local(hostname)
        except UsageError as err:
            self._unresolvable.add(hostname)
            log.error("ignoring discovered host: %s", err)
            return False
        return True

    def bind_address(self, hosts: list[HostSpec], interface: str | None) -> str:
        """The interface's address if given; loopback when every host is local; else the
        address that routes to the first remote host."""
        if interface:
            return interface_address(interface)
        remote = [h.hostname for h in hosts if not self.is_local(h.hostname)]
        return route_source(remote[0]) if remote else "127.0.0.1"

    def launcher(self, hostname: str) -> Launcher:
        return self._local_launcher if self.is_local(hostname) else self._ssh_launcher

    async def check_reachable(self, hostnames: set[str], fatal: bool) -> set[str]:
        """Check ssh to the remote hosts not checked yet; return the unreachable ones (each
        logged). With `fatal`, the first unreachable host raises `LaunchError` instead."""
        remote = sorted(h for h in hostnames if not self.is_local(h) and h not in self._reachable)
        checks = [self._ssh_launcher.check_reachable(h, self._ssh_timeout) for h in remote]
        failed = set()
        results = await asyncio.gather(*checks, return_exceptions=True)
        for hostname, result in zip(remote, results, strict=True):
            if isinstance(result, BaseException):
                if fatal or not isinstance(result, LaunchError):
                    raise result
                log.error("%s", result)
                failed.add(hostname)
            else:
                self._reachable.add(hostname)
        return failed
