"""Which private /24 a new bed takes, and the bridge that holds its driver-side address.

Beds may coexist (two test sessions, a bench script): each takes the first /24 of `SUBNETS`
in which no interface has an address and to which no route leads, and claims it by putting
the driver's address on its bridge, all under one file lock. The bridge's alias names the
process that owns the bed, so leftovers of a killed owner can be found (tests/multihost/
leftovers.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

from tests.multihost.namespaces import disable_ipv6, ip, ip_json

SUBNETS = tuple(ipaddress.IPv4Network(f"10.213.{third}.0/24") for third in range(47, 63))
LOCK = Path("/run/lock/elasticrun-bed.lock")
OWNER_ALIAS = "elasticrun-bed pid="  # + the owner's pid: the alias of every link a bed makes


@contextlib.contextmanager
def claim_lock() -> Iterator[None]:
    """Hold the machine-wide lock under which beds choose subnets and sweep leftovers."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def subnets_in_use() -> list[ipaddress.IPv4Network]:
    """Networks of every IPv4 address on an interface, and of every route but the default."""
    used = [
        ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
        for link in ip_json("-4", "addr", "show")
        for info in link.get("addr_info", [])
    ]
    for route in ip_json("-4", "route", "show", "table", "all"):
        destination = route.get("dst", "default")
        if destination != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(destination, strict=False))
    return used


def free_subnet() -> ipaddress.IPv4Network | None:
    """The first of SUBNETS that overlaps no address or route of this machine; None if all
    do. Call it under `claim_lock`, and claim the result before releasing the lock."""
    used = subnets_in_use()
    for candidate in SUBNETS:
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    return None


def make_bridge(name: str, address: ipaddress.IPv4Interface) -> None:
    """Create bridge `name` holding `address` (the driver's side of the bed), up, with the
    alias that names this process as its owner.

    Its MAC address is set, never derived: a bridge otherwise takes the lowest MAC of its
    ports, so a host that vanished (its port gone) or came back could change the driver's
    MAC, and every other host would send to the old one, heartbeats lost, until its ARP
    entry expired (the bed soak saw every worker declared dead after one host vanished)."""
    ip("link", "add", name, "address", _bridge_mac(), "type", "bridge")
    disable_ipv6(name)
    ip("link", "set", name, "alias", f"{OWNER_ALIAS}{os.getpid()}")
    ip("addr", "add", str(address), "dev", name)
    ip("link", "set", name, "up")


def _bridge_mac() -> str:
    """A random locally administered unicast MAC address."""
    return ":".join(["02", *(f"{b:02x}" for b in os.urandom(5))])
