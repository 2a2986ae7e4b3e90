"""What beds left behind: their namespaces, links and nft tables, by owner.

Every name a bed gives carries its owner's pid: namespaces `ebed-PID-TAG-HOST`, nft tables
`ebed_PID_TAG`, links an alias `elasticrun-bed pid=PID`. A bed closes what it made, also when
a test fails; only an owner killed outright (SIGKILL, a crash) leaves anything, and the next
bed built on the machine sweeps what belongs to owners no longer alive.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.multihost.namespaces import ip, ip_json, kill_all
from tests.multihost.subnet import OWNER_ALIAS

NAMESPACE_PATTERN = re.compile(r"^ebed-(\d+)-")
TABLE_PATTERN = re.compile(r"^ebed_(\d+)_")


@dataclass
class Remains:
    """Names of bed resources present on the machine, with their owners' pids."""

    namespaces: dict[str, int] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)
    tables: dict[str, int] = field(default_factory=dict)

    def names(self) -> set[str]:
        return {*self.namespaces, *self.links, *self.tables}


def survey() -> Remains:
    """Every bed namespace, link and nft table on this machine, whoever owns it."""
    found = Remains()
    for entry in ip_json("netns", "list"):
        if match := NAMESPACE_PATTERN.match(entry["name"]):
            found.namespaces[entry["name"]] = int(match.group(1))
    for link in ip_json("link", "show"):
        alias = link.get("ifalias") or ""
        if alias.startswith(OWNER_ALIAS) and alias[len(OWNER_ALIAS) :].isdigit():
            found.links[link["ifname"]] = int(alias[len(OWNER_ALIAS) :])
    listed = subprocess.run(
        ["nft", "-j", "list", "tables", "netdev"], capture_output=True, text=True, timeout=30
    )
    for item in json.loads(listed.stdout or "{}").get("nftables", []):
        name = item.get("table", {}).get("name", "")
        if match := TABLE_PATTERN.match(name):
            found.tables[name] = int(match.group(1))
    return found


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def sweep_orphans() -> list[str]:
    """Remove bed resources whose owner process is gone; return their names. Resources of
    live owners (other beds running now) are left alone."""
    remains = survey()
    swept = []
    for name, owner in remains.namespaces.items():
        if not _alive(owner):
            kill_all(name)
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", name)
            swept.append(name)
    for name, owner in remains.links.items():
        if not _alive(owner):
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", name)
            swept.append(name)
    for name, owner in remains.tables.items():
        if not _alive(owner):
            command = ["nft", "delete", "table", "netdev", name]
            subprocess.run(command, capture_output=True, timeout=30)
            swept.append(name)
    return swept
