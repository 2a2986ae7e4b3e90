"""A bed host's machine: a network namespace plugged into the bed's bridge by a veth pair.

Thin wrappers around `ip`; each raises `subprocess.CalledProcessError` (with ip's complaint)
when ip fails, except where a docstring says the call tolerates what is already gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HOST_INTERFACE = "eth0"  # the host's end of its veth, inside its namespace
KILL_TIMEOUT = 5.0


def ip(*args: str, namespace: str | None = None) -> str:
    """Run `ip [-n namespace] ARGS`; return its output; raise CalledProcessError on failure."""
    where = ["-n", namespace] if namespace else []
    done = subprocess.run(
        ["ip", *where, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def ip_json(*args: str) -> list[dict]:
    """`ip -j ARGS` parsed (an empty list for no output)."""
    return json.loads(ip("-j", *args) or "[]")


@dataclass(frozen=True)
class Plug:
    """How one host's namespace is wired: the namespace, its address on the bridge, and the
    root-namespace end of its veth (`link`, a port of `bridge`: "the wire"). The MAC
    addresses stay the same across `unplug`/`plug`, as a rebooted machine's NIC does, so
    neighbours' ARP caches stay right."""

    namespace: str
    address: str
    prefix_length: int
    link: str
    bridge: str
    host_mac: str
    link_mac: str
    alias: str  # the link's alias: names the bed's owner (tests/multihost/leftovers.py)


def plug(spec: Plug) -> None:
    """Create the namespace and its veth pair, address the host's end, bring both ends and
    the namespace's loopback up. The namespace and link must not exist yet."""
    ip("netns", "add", spec.namespace)
    ip(
        "link", "add", spec.link, "address", spec.link_mac, "type", "veth",
        "peer", "name", HOST_INTERFACE, "address", spec.host_mac, "netns", spec.namespace,
    )  # fmt: skip
    ip("link", "set", spec.link, "alias", spec.alias)
    ip("link", "set", spec.link, "master", spec.bridge, "up")
    address, inside = f"{spec.address}/{spec.prefix_length}", spec.namespace
    # IPv4 only on the wire: no link-local IPv6 chatter, nothing a partition lets through.
    disable_ipv6(spec.link)
    switch = f"/proc/sys/net/ipv6/conf/{HOST_INTERFACE}/disable_ipv6"
    turn_off = exec_in(inside, ["sh", "-c", f"[ ! -e {switch} ] || echo 1 > {switch}"])
    subprocess.run(turn_off, check=True, capture_output=True, text=True, timeout=30)
    ip("addr", "add", address, "dev", HOST_INTERFACE, namespace=inside)
    ip("link", "set", HOST_INTERFACE, "up", namespace=inside)
    ip("link", "set", "lo", "up", namespace=inside)


def disable_ipv6(link: str) -> None:
    """Turn IPv6 off on `link` of the root namespace (nothing where the kernel has none)."""
    switch = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if switch.exists():
        switch.write_text("1")


def unplug(spec: Plug) -> None:
    """Cut the wire (link down), SIGKILL every process in the namespace, delete the veth pair,
    then the namespace; nothing the host sends after the first step reaches anyone. Tolerates
    parts already gone."""
    with contextlib.suppress(subprocess.CalledProcessError):
        ip("link", "set", spec.link, "down")
    kill_all(spec.namespace)
    # Deleting one end deletes the pair: sockets orphaned in the namespace (a FIN_WAIT that
    # keeps the namespace alive a while) have no device left to send through.
    with contextlib.suppress(subprocess.CalledProcessError):
        ip("link", "del", spec.link)
    with contextlib.suppress(subprocess.CalledProcessError):
        ip("netns", "del", spec.namespace)


def namespace_pids(namespace: str) -> list[int]:
    """The processes in `namespace` (`ip netns pids`); none when it does not exist."""
    try:
        return [int(pid) for pid in ip("netns", "pids", namespace).split()]
    except subprocess.CalledProcessError:
        return []


def kill_all(namespace: str) -> None:
    """SIGKILL every process in `namespace` until none is left (children forked meanwhile
    included); raise RuntimeError if some survive KILL_TIMEOUT seconds (stuck in the kernel)."""
    deadline = time.monotonic() + KILL_TIMEOUT
    while pids := namespace_pids(namespace):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {namespace} survive SIGKILL")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)  # until they are gone from /proc: the deadline bounds it


def exec_in(namespace: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` in `namespace` (ip execs it: same PID)."""
    return ["ip", "netns", "exec", namespace, *argv]
