"""Discovery over a fixed host list: `-H host:slots,...` or `--hostfile`."""

from __future__ import annotations

from collections.abc import Iterable

from elastic.driver.discovery.host_discovery import HostDiscovery
from elastic.driver.discovery.hosts import HostSpec


class FixedHosts(HostDiscovery):
    """`HostDiscovery` of always the same hosts (already parsed and checked by
    `elastic.driver.discovery.hosts`); see `HostDiscovery.find` for the contract. Never
    raises: a fixed list cannot fail.
    """

    def __init__(self, hosts: Iterable[HostSpec]) -> None:
        self._hosts = tuple(hosts)

    async def find(self) -> list[HostSpec]:
        """The hosts given at construction, in their order (a fresh list each call)."""
        return list(self._hosts)
