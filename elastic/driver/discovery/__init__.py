"""Host discovery: the interface, its implementations, host lists, cooldown and the tracker
the driver feeds."""

from elastic.driver.discovery.fixed import FixedHosts
from elastic.driver.discovery.host_discovery import DiscoveryError, HostDiscovery
from elastic.driver.discovery.script import ScriptDiscovery
from elastic.driver.discovery.tracker import HostChange, HostTracker, TrackerUpdate

__all__ = [
    "DiscoveryError",
    "FixedHosts",
    "HostChange",
    "HostDiscovery",
    "HostTracker",
    "ScriptDiscovery",
    "TrackerUpdate",
]
