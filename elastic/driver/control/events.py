"""Events the driver sends down each worker's control stream, and what the service asks of
the driver when workers call it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from elastic.protocol.beats import Activity
from elastic.protocol.http import SlotInfo


@dataclass(frozen=True)
class HostsUpdated:
    """Round `next_round` is formed; incumbents move to it at their next commit.

    With `broken_round` (> 0) it is also the word that round `broken_round` is broken, for
    `broken_reason`: the worker acts on it as on a `RoundBroken` before it takes its slot,
    so a death costs each survivor one event, not two. (On the wire, `pb.HostsUpdated`, the
    two rounds keep their first names: `next_epoch`, `broken_epoch`.)
    """

    version: int
    next_round: int
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    broken_round: int = 0
    broken_reason: str = ""
    leave: bool = False  # the worker it goes to is no member of `next_round`: it leaves


@dataclass(frozen=True)
class RoundBroken:
    """A member of round `round` died: every collective of that round must fail at once.

    `rejoin`: the next round waits for this worker at the rendezvous, so it joins over HTTP
    at once instead of waiting for its slot on the event stream. (On the wire it is still
    `pb.EpochBroken`.)"""

    round: int
    reason: str
    rejoin: bool = False


ControlEvent = HostsUpdated | RoundBroken

Placement = Callable[[str, int], Awaitable[tuple[SlotInfo, int] | None]]
"""`placement(worker_id, number)`: the worker's slot in round `number` and the job's newest
commit count, as an HTTP join of that round would answer them (once the round is saved), or
None when round `number` is no longer the newest or the worker is no member of it."""


class WorkerListener(Protocol):
    """What the control service reports to the driver. Called on the driver's event loop.

    Every method that returns False means "no such live worker": the service answers
    NOT_FOUND and the worker exits.
    """

    def registered(self, worker_id: str, pid: int) -> bool:
        """A worker process announced itself."""

    def heartbeat(
        self,
        worker_id: str,
        round: int,
        commit: int,
        durable: int = 0,
        stale: bool = False,
        activity: Activity | None = None,
    ) -> bool:
        """A worker is alive, in round `round`, having made `commit` state commits; it wrote commit
        `durable` to the checkpoint directory last (0: none), its last write failed if
        `stale`, and it does what `activity` says."""

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        """A worker having made `commit` state commits asks to leave at its next commit
        (SIGTERM, drained host), or says it exits (reasons in `elastic.protocol.leave`)."""

    def unreachable(self, worker_id: str, round: int, ranks: frozenset[int]) -> bool:
        """A member of round `round` found its peers of `ranks` unreachable."""

    def notice(self, worker_id: str, leaving_at: float) -> bool:
        """A worker's host goes at `leaving_at` (Unix seconds; +inf: soon)."""

    def stream_opened(self, worker_id: str) -> asyncio.Queue[ControlEvent] | None:
        """A worker opened its event stream: return the queue its events will come from."""

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[ControlEvent]) -> None:
        """The event stream fed by `queue` ended (the worker died, is exiting, or reconnected:
        a reconnecting worker's new stream may open before its old one is seen closing)."""
