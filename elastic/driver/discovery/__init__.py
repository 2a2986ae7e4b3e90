"""Host discovery: which hosts the job may use, and which of them it may use now.

A `HostDiscovery` (`host_discovery.py`: the interface) answers with the hosts offered now:
`FixedHosts` for `-H`/`--hostfile`, `ScriptDiscovery` for `--host-discovery-script`. The
`HostTracker` (pure) turns each answer into the usable hosts, taking out hosts in cooldown
(`cooldown.py`: a failed host is excluded for a time that doubles per failure), drained or
about to be preempted, and says what changed; the `HostWatcher` polls and reports changes.
"""

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
