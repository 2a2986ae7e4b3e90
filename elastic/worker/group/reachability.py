"""Whether a round's peers answer at all, asked when a collective stays blocked.

A peer on a host cut off from this one, but not from the driver, keeps heartbeating and
never closes its connections: a collective blocked on it would wait for the collective
timeout. Every worker answers probes on a UDP port of its address toward the driver
(`ProbeResponder`), published in each round's store. A worker whose collective
stays blocked for `PROBE_AFTER` seconds probes a few peers (`probe_targets`) from a
background thread and reports those that never answer to the driver (`PeerWatch`), which
decides which host to cut off (`elastic.driver.policy.reachability`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection

import torch.distributed as dist

log = logging.getLogger(__name__)

PROBE_AFTER = 1.0  # seconds a collective blocks before its peers are probed
PROBE_EVERY = 5.0  # seconds between two probes while it stays blocked
TRIES = 3  # probes sent to a silent peer, `TRY_EVERY` apart: one lost datagram is no verdict
TRY_EVERY = 0.2
PROBE_ALL_UP_TO = 16  # ranks in a round whose members all probe each other
MAGIC = b"elastic-probe\x00"
DATAGRAM_LIMIT = 64  # bytes: a probe is `MAGIC` + 12; anything longer is not answered

Report = Callable[[int, set[int]], None]
"""`report(round, ranks)`: tell the driver these ranks of `round` did not answer."""


def key(rank: int) -> str:
    """The round-store key under which `rank` publishes its probe address."""
    return f"elastic/reach/{rank}"


class ProbeResponder:
    """Echoes every probe datagram sent to `address` (host:port, the port free at start),
    from a daemon thread, until `close`. Datagrams that are not probes are dropped."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.bind((host, 0))
        self._socket.settimeout(0.5)
        port = self._socket.getsockname()[1]
        self.address = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, name="elastic-probes", daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        while not self._stop.is_set():
            try:
                data, sender = self._socket.recvfrom(DATAGRAM_LIMIT + 1)
            except TimeoutError:
                continue
            except OSError:
                return
            if data.startswith(MAGIC) and len(data) <= DATAGRAM_LIMIT:
                with contextlib.suppress(OSError):
                    self._socket.sendto(data, sender)

    def close(self) -> None:
        """Stop answering; returns within about half a second."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        self._socket.close()


def probe_targets(rank: int, size: int) -> list[int]:
    """The peers `rank` probes: every other rank in a round of up to `PROBE_ALL_UP_TO`;
    in a larger one those 1, 2, 4, ... ranks away on either side of it, so that every rank
    is probed by about 2 log2(size) others and a probe of the whole round costs
    O(size log size) datagrams, not O(size^2)."""
    if size <= PROBE_ALL_UP_TO:
        return [peer for peer in range(size) if peer != rank]
    targets = set()
    step = 1
    while step < size:
        targets.update(((rank + step) % size, (rank - step) % size))
        step *= 2
    targets.discard(rank)
    return sorted(targets)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def silent_peers(
    addresses: dict[int, str], tries: int = TRIES, every: float = TRY_EVERY
) -> set[int]:
    """The ranks whose address (host:port of a `ProbeResponder`) answered none of `tries`
    probes sent `every` seconds apart. Returns within about `tries * every` seconds."""
    if not addresses:
        return set()
    nonce = os.urandom(8)
    targets = {rank: _split(address) for rank, address in addresses.items()}
    silent = set(targets)
    family = socket.AF_INET6 if any(":" in host for host, _ in targets.values()) else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        for _ in range(tries):
            for rank in silent:
                with contextlib.suppress(OSError):  # an unroutable peer is a silent one
                    sock.sendto(MAGIC + nonce + rank.to_bytes(4, "big"), targets[rank])
            deadline = time.monotonic() + every
            while silent and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    data = sock.recv(DATAGRAM_LIMIT + 1)
                except ConnectionRefusedError:  # an ICMP error of an earlier probe
                    continue
                except OSError:  # timed out
                    break
                if data.startswith(MAGIC + nonce) and len(data) == len(MAGIC) + 12:
                    silent.discard(int.from_bytes(data[-4:], "big"))
            if not silent:
                break
    return silent


def peer_addresses(store: dist.Store, ranks: Collection[int]) -> dict[int, str]:
    """The probe addresses of `ranks` published in `store`; a rank that published none
    (it never reached the round) is left out."""
    found = {}
    for rank in ranks:
        if store.check([key(rank)]):
            found[rank] = store.get(key(rank)).decode()
    return found


def probe_round(store: dist.Store, number: int, rank: int, size: int, report: Report) -> None:
    """Probe `rank`'s targets among round `number`'s peers and `report` the silent ones.
    Never raises: a failure to probe is logged and reports nothing."""
    try:
        silent = silent_peers(peer_addresses(store, probe_targets(rank, size)))
        if silent:
            log.warning(
                "rank %d: peer rank(s) %s of round %d do not answer probes; telling the driver",
                rank,
                sorted(silent),
                number,
            )
            report(number, silent)
    except Exception as err:  # the driver is away, the store timed out: nothing to report
        log.debug("rank %d: could not probe the peers of round %d: %s", rank, number, err)


def _publish(store: dist.Store, rank: int, address: str) -> None:
    try:
        store.set(key(rank), address)
    except Exception as err:  # a daemon thread: nothing to raise to
        log.debug("rank %d: its probe address was not published: %s", rank, err)


class PeerWatch:
    """This worker's side of reachability: its `responder`, published in each round's store
    (`publish`), and probes of the round's peers while a collective stays blocked
    (`blocked`, called between the slices of every wait, starts a probe in a daemon thread,
    one at a time, once the collective has blocked for `PROBE_AFTER` s, and again every
    `PROBE_EVERY` s), whose silent peers go to `report`."""

    def __init__(self, responder: ProbeResponder, report: Report) -> None:
        self.responder = responder
        self._report = report
        self._probing: threading.Thread | None = None
        self._last_probe = float("-inf")

    def publish(self, store: dist.Store, rank: int) -> None:
        """Publish `rank`'s probe address in its round's `store` (the driver's KV), from a
        daemon thread: the round's group forms meanwhile, a probe comes a second later at
        the soonest. A failure (the round superseded, the driver gone) is logged, no more."""
        threading.Thread(
            target=_publish, args=(store, rank, self.responder.address), daemon=True
        ).start()

    def close(self) -> None:
        self.responder.close()

    def blocked(self, store: dist.Store, number: int, rank: int, size: int, since: float) -> None:
        """A collective of round `number` has blocked since `since` (time.monotonic)."""
        now = time.monotonic()
        if now - since < PROBE_AFTER or now - self._last_probe < PROBE_EVERY:
            return
        if self._probing is not None and self._probing.is_alive():
            return
        self._last_probe = now
        self._probing = threading.Thread(
            target=probe_round,
            args=(store, number, rank, size, self._report),
            name="elastic-probe-peers",
            daemon=True,
        )
        self._probing.start()
