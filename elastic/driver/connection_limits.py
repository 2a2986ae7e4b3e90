"""Pieces shared by the driver's listening ports to bound what strangers hold: the connections
that have not authenticated yet, oldest first and counted per peer address, and the one
warning line a port logs when a limit closes connections, however many it closes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Connection = TypeVar("Connection", bound=Hashable)


class WaitingConnections(Generic[Connection]):
    """Connections waiting to authenticate, oldest first, with their peer and opening time.

    Of those that have waited past a grace, at most `max_total` should stay, and at most
    `max_per_peer` from one peer address: `over_limits` names the oldest ones past those
    numbers, for the caller to close. Memory is bounded by the number of connections waiting:
    a peer with none waiting is forgotten.
    """

    def __init__(self, max_total: int, max_per_peer: int) -> None:
        if max_total < 1 or max_per_peer < 1:
            raise ValueError(f"limits must be positive: {max_total}, {max_per_peer}")
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._all: dict[Connection, tuple[str, float]] = {}  # insertion order: oldest first
        self._of_peer: dict[str, dict[Connection, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, connection: object) -> bool:
        return connection in self._all

    def of_peer(self, peer: str) -> int:
        """How many connections from `peer` wait."""
        return len(self._of_peer.get(peer, ()))

    def add(self, connection: Connection, peer: str, opened: float) -> None:
        """`connection` from `peer`, opened at `opened` (a monotonic time, not before the
        last one added), now waits. The limits are not checked here (`over_limits`)."""
        self._all[connection] = (peer, opened)
        self._of_peer.setdefault(peer, {})[connection] = None

    def discard(self, connection: Connection) -> None:
        """`connection` no longer waits (it authenticated, or it is closed); no-op if it did
        not."""
        found = self._all.pop(connection, None)
        if found is None:
            return
        peer = found[0]
        waiting = self._of_peer[peer]
        del waiting[connection]
        if not waiting:
            del self._of_peer[peer]

    def oldest(self) -> Connection | None:
        """The connection that has waited longest; None when none waits."""
        return next(iter(self._all), None)

    def opened_before(self, moment: float) -> list[Connection]:
        """The waiting connections opened before `moment`, oldest first."""
        expired = []
        for connection, (_, opened) in self._all.items():
            if opened >= moment:
                break
            expired.append(connection)
        return expired

    def over_limits(self, opened_before: float) -> list[Connection]:
        """The connections to close among those opened before `opened_before` (younger ones
        are given that long to authenticate, and are not counted): first the oldest of each
        peer with more than `max_per_peer` such connections, then everyone's oldest while
        more than `max_total` remain."""
        if len(self._all) <= min(self.max_total, self.max_per_peer):
            return []
        old: list[tuple[Connection, str]] = []
        counts: dict[str, int] = {}
        for connection, (peer, opened) in self._all.items():
            if opened >= opened_before:
                break
            old.append((connection, peer))
            counts[peer] = counts.get(peer, 0) + 1
        chosen: dict[Connection, None] = {}
        for connection, peer in old:
            if counts[peer] > self.max_per_peer:
                chosen[connection] = None
                counts[peer] -= 1
        left = len(old) - len(chosen)
        for connection, _ in old:
            if left <= self.max_total:
                break
            if connection not in chosen:
                chosen[connection] = None
                left -= 1
        return list(chosen)


class OverLimitLog:
    """One warning line per reason and per `every` seconds, however often a limit acts.

    The first event of a reason is logged at once; later ones within `every` seconds are
    counted, and the next line of that reason says how many there were. Reasons are a few
    fixed strings (never a peer's address), so memory stays bounded.
    """

    def __init__(
        self,
        logger: logging.Logger,
        port: str,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._port = port
        self.every = every
        self._clock = clock
        self._reasons: dict[str, list[float]] = {}  # reason: [last logged at, events since]

    def note(self, reason: str) -> None:
        """One more event of `reason` (a sentence, e.g. "closed a connection over ...")."""
        now = self._clock()
        seen = self._reasons.get(reason)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            return
        since = int(seen[1]) if seen is not None else 0
        more = f" ({since} more since the last such line)" if since else ""
        self._log.warning("%s: %s%s", self._port, reason, more)
        self._reasons[reason] = [now, 0]
