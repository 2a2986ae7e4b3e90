"""What the job's parts report to it, through one queue, in the order things happened.

The fleet reports exits, the liveness watch its verdicts, the rendezvous who waits and who
joined, the control service what workers ask, the host watcher changes of the usable hosts.
`Job` takes them off the queue one at a time and hands each to its `Conductor`, which asks
the policy and acts; none of the parts calls into either.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from elastic.driver.discovery import HostChange
from elastic.driver.policy.liveness import Verdict
from elastic.driver.workers import Worker


@dataclass(frozen=True)
class WorkerExited:
    """`worker`'s process ended; its `exit_code` is set."""

    worker: Worker


@dataclass(frozen=True)
class Judged:
    """The liveness watch found `worker` silent, closed or late (`verdict`)."""

    worker: Worker
    verdict: Verdict


@dataclass(frozen=True)
class Tick:
    """The liveness watch's periodic look, at `now`: time-based rules may apply."""

    now: float


@dataclass(frozen=True)
class Waiting:
    """`worker_id`, its state holding `commit` commits, waits for a round after `after`."""

    worker_id: str
    after: int
    commit: int


@dataclass(frozen=True)
class Joined:
    """`worker_id` received its slot in a round."""

    worker_id: str


@dataclass(frozen=True)
class Heard:
    """A worker said (in a heartbeat) that it is in round `round` with `commit` commits."""

    worker_id: str
    round: int
    commit: int


@dataclass(frozen=True)
class LeaveAsked:
    """A worker with `commit` commits asks to leave, or says it exits (`reason`)."""

    worker_id: str
    reason: str
    commit: int


@dataclass(frozen=True)
class PeersUnreachable:
    """A member of round `round` found the peers of `ranks` unreachable (no probe answer)."""

    worker_id: str
    round: int
    ranks: frozenset[int]


@dataclass(frozen=True)
class KeysLost:
    """Round `round`, taken up from an earlier driver, waits for rendezvous keys this driver
    does not hold (see `Services.keys_lost`)."""

    round: int


@dataclass(frozen=True)
class HostNoticed:
    """A worker's preemption check says its host goes at `leaving_at` (Unix seconds; +inf:
    soon, no time known)."""

    hostname: str
    leaving_at: float


@dataclass(frozen=True)
class DurableStale:
    """The worker that writes durable commits says its last write failed (`stale`) or that
    one succeeded again; `written` is the newest commit it wrote (0: none)."""

    worker_id: str
    stale: bool
    written: int


@dataclass(frozen=True)
class DrainAsked:
    """An operator drained `hostname` (or, `drained` False, undrained it)."""

    hostname: str
    drained: bool


@dataclass(frozen=True)
class StopAsked:
    """An operator asked the job to stop (`elasticrun stop`)."""


@dataclass(frozen=True)
class HostsChanged:
    """Discovery or a cooldown changed the usable hosts."""

    change: HostChange


Report = (
    WorkerExited
    | Judged
    | Tick
    | Waiting
    | Joined
    | Heard
    | LeaveAsked
    | PeersUnreachable
    | KeysLost
    | HostNoticed
    | DurableStale
    | DrainAsked
    | StopAsked
    | HostsChanged
)
Reports = asyncio.Queue[Report]
