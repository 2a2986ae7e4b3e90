"""The network interface Gloo binds when the user names none: the one that reaches the driver.

Gloo's default device binds the address this machine's host name resolves to, or loopback
when that address is not local. Where the name resolves to loopback (`127.0.0.1 vm` or
Debian's `127.0.1.1` line, containers, network namespaces) or to an address on a network the
other hosts do not share, every rank tells its peers an address they cannot reach, and the
ranks of different hosts never connect ("Connection refused" to 127.0.0.1). The workers of
every host reach the driver, so the interface holding the source address of this machine's
route to the driver is one the other hosts can reach: `choose_gloo_interface` names it in
`GLOO_SOCKET_IFNAME` (which torch reads each time it creates a Gloo group) unless the user
set that variable. On one machine (a local job, driver on loopback) that is `lo`.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import MutableMapping
from pathlib import Path

GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915
_IF_INET6 = Path("/proc/net/if_inet6")

log = logging.getLogger(__name__)


def source_address(host: str) -> str | None:
    """The local address this machine sends from to reach `host` (a name or an address);
    no packet is sent. None when `host` does not resolve or no route leads to it."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(sockaddr)
            return sock.getsockname()[0].partition("%")[0]
    except OSError:  # socket.gaierror included
        return None


def primary_ipv4_address(interface: str) -> str | None:
    """The primary IPv4 address of `interface`; None when it has none or does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            request = struct.pack("256s", interface[:15].encode())
            return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24])
        except OSError:
            return None


def interface_with(address: str) -> str | None:
    """The name of the interface holding `address` (IPv4: as its primary address, which a
    route's source is; IPv6: any of its addresses), or None when none does."""
    wanted = ipaddress.ip_address(address)
    if wanted.version == 6:
        if not _IF_INET6.exists():
            return None
        for line in _IF_INET6.read_text().splitlines():
            fields = line.split()
            if ipaddress.IPv6Address(bytes.fromhex(fields[0])) == wanted:
                return fields[-1]
        return None
    for _, name in socket.if_nameindex():
        if primary_ipv4_address(name) == address:
            return name
    return None


def choose_gloo_interface(
    driver_host: str, environ: MutableMapping[str, str] = os.environ
) -> str | None:
    """Make Gloo bind the interface that reaches `driver_host`: set `GLOO_SOCKET_IFNAME` in
    `environ` to its name, unless the variable is set already (the user's choice wins).
    Returns the value in effect; None (and nothing set: Gloo goes by the host name) when the
    driver's host does not resolve or no interface holds the route's source address."""
    if environ.get(GLOO_SOCKET_IFNAME):
        return environ[GLOO_SOCKET_IFNAME]
    source = source_address(driver_host)
    interface = interface_with(source) if source else None
    if interface is None:
        log.warning(
            "no interface found whose address reaches the driver at %s; Gloo binds the "
            "address of this host's name (set %s to choose)",
            driver_host,
            GLOO_SOCKET_IFNAME,
        )
        return None
    environ[GLOO_SOCKET_IFNAME] = interface
    log.debug("Gloo binds %s (%s), the interface that reaches the driver", interface, source)
    return interface
