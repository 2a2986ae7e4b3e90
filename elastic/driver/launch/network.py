"""Which host names are this machine, and which address the driver's servers bind to."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

from elastic.driver.errors import UsageError

_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str:
    """Return the IPv4 address of network interface `name`; raise `UsageError` if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
            )
        except OSError:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise UsageError(
                f"--network-interface: {name!r} has no IPv4 address (interfaces: {known})"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def local_addresses() -> set[str]:
    """Addresses assigned to this machine's interfaces (IPv4 and IPv6).

    Only assigned addresses count: 127.0.0.2 routes to loopback but is no interface's address,
    so a host named that way is treated as remote (reached through ssh).
    """
    addresses = {"127.0.0.1", "::1"}
    for _, name in socket.if_nameindex():
        with contextlib.suppress(UsageError):
            addresses.add(interface_address(name))
    inet6 = Path("/proc/net/if_inet6")
    if inet6.exists():
        for line in inet6.read_text().splitlines():
            raw = line.split()[0]
            addresses.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    return addresses


def resolve(hostname: str) -> set[str]:
    """All addresses `hostname` resolves to; raise `UsageError` for an unknown host."""
    try:
        infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        raise UsageError(f"unknown host {hostname!r}: it does not resolve to an address") from None
    return {str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in infos}


def own_names() -> set[str]:
    """This machine's host name and fully qualified name (a DNS lookup: as slow as DNS)."""
    return {socket.gethostname(), socket.getfqdn()}


def look_up(hostname: str, local: set[str], names: set[str]) -> tuple[bool, set[str]]:
    """Whether `hostname` is this machine (one of its `names`, or a name resolving to one of
    its `local` addresses), and the addresses it resolves to (none looked up for one of
    `names`). Blocks for as long as DNS takes; raises `UsageError` for an unknown host."""
    if hostname in names:
        return True, set()
    addresses = resolve(hostname)
    return bool(addresses & local), addresses


def is_local(hostname: str, local: set[str]) -> bool:
    """True when `hostname` is this machine: its name, or a name resolving to a local address."""
    return look_up(hostname, local, own_names())[0]


def route_source(hostname: str, addresses: set[str] | None = None) -> str:
    """The local address this machine uses to reach `hostname`, which resolves to
    `addresses` (looked up here when not given); no packet is sent."""
    address = sorted(addresses or resolve(hostname))[0]
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return sock.getsockname()[0]
