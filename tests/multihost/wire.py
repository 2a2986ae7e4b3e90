"""Partitions: silent drops of IP packets on the wire between a bed host and the others.

One nftables table (family `netdev`) per bed, in the root namespace. A partitioned host gets
two base chains on the root end of its veth: `ingress` sees what the host sends, `egress`
what is sent to it. Dropping there is the wire losing packets: no ICMP, no RST, and no EPERM
for the sender (a drop in a namespace's OUTPUT hook would fail the sender's send()). Only IP
packets are dropped: ARP still passes, as it would past a router that drops a subnet.
"""

from __future__ import annotations

import subprocess
from typing import Literal

Side = Literal["driver", "peers"]


def _nft(script: str) -> None:
    """Run an nft script atomically; raise CalledProcessError with nft's complaint."""
    command = ["nft", "-f", "-"]
    done = subprocess.run(command, input=script, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, script, done.stderr)


def create_table(table: str) -> None:
    """Create the bed's empty table; raise CalledProcessError where nftables cannot."""
    _nft(f"add table netdev {table}\n")


def delete_table(table: str) -> None:
    """Delete the bed's table and every chain in it; nothing if it is gone already."""
    _nft(f"add table netdev {table}\ndelete table netdev {table}\n")


def _drops(side: Side, driver: str, subnet: str) -> tuple[str, str]:
    """The (ingress, egress) matches of packets to drop: to and from `driver`, or to and
    from any other address of `subnet`."""
    if side == "driver":
        return f"ip daddr {driver}", f"ip saddr {driver}"
    return (
        f"ip daddr {subnet} ip daddr != {driver}",
        f"ip saddr {subnet} ip saddr != {driver}",
    )


def cut(table: str, chain: str, link: str, side: Side, driver: str, subnet: str) -> None:
    """Drop IP packets between the host behind `link` and `side` (the driver's address, or
    the other addresses of `subnet`), replacing any earlier cut of this host. Raises
    CalledProcessError where the kernel lacks the netdev egress hook."""
    into, out_of = _drops(side, driver, subnet)
    _nft(
        f'add chain netdev {table} {chain}_from {{ type filter hook ingress device "{link}" '
        "priority 0; }\n"
        f'add chain netdev {table} {chain}_to {{ type filter hook egress device "{link}" '
        "priority 0; }\n"
        f"flush chain netdev {table} {chain}_from\n"
        f"flush chain netdev {table} {chain}_to\n"
        f"add rule netdev {table} {chain}_from {into} drop\n"
        f"add rule netdev {table} {chain}_to {out_of} drop\n"
    )


def mend(table: str, chain: str) -> None:
    """Remove this host's cut (which `cut` must have made)."""
    _nft(f"delete chain netdev {table} {chain}_from\ndelete chain netdev {table} {chain}_to\n")
