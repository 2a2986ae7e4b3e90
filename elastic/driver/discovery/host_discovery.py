"""The host discovery interface: where the driver learns which hosts it may use.

Implementations: `FixedHosts` (`-H` / `--hostfile`, a list that never changes) and
`ScriptDiscovery` (`--host-discovery-script`, run at every poll). The driver polls `find()`
and feeds each result, or each `DiscoveryError`, to a `HostTracker`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from elastic.driver.discovery.hosts import HostSpec
from elastic.errors import ElasticError


class DiscoveryError(ElasticError):
    """Discovery could not produce a host list this time. `str(err)` is one line naming the
    problem (which script, which output line, what it printed to stderr, ...)."""


class HostDiscovery(ABC):
    """A source of the hosts the job may use, asked at every poll (`find`)."""

    @abstractmethod
    async def find(self) -> list[HostSpec]:
        """Ask the source which hosts are available now.

        Returns:
            The hosts available now, in the order the source gives them, each named once.
            An empty list is a valid answer: no host is available right now.

        Raises:
            DiscoveryError: the source failed this time (one line says why); the caller
                keeps its last good list and asks again at the next poll.

        Cancelling the call leaves no process or resource behind.
        """
