"""The worker runtime's single process-wide context.

`init()` creates it, `shutdown()` clears it; every collective reads it through `current()`.
What outlives rounds and `shutdown()` (the membership a later `init()` takes up again, the
process's settings) is in `process_wide()`. This is the only module-level mutable state in
the package.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from elastic.errors import ElasticError
from elastic.protocol.http import SlotInfo
from elastic.worker.collectives.in_flight import InFlight
from elastic.worker.config import WorkerConfig
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.http_client import DriverClient
from elastic.worker.driver_link.membership_events import MembershipEvents
from elastic.worker.driver_link.progress import Progress
from elastic.worker.group.reachability import PeerWatch


class NotInitializedError(ElasticError, RuntimeError):
    """Raised by every collective and query called before `init()` or after `shutdown()`."""

    def __init__(self, what: str = "this call") -> None:
        super().__init__(
            f"{what} needs elastic.torch.init() first: the worker runtime is not initialized"
        )


@dataclass
class WorkerContext:
    """What one formed round gives a worker: its slot, the group and the device it uses.

    `events` is the process's one `MembershipEvents`, carried from round to round; `config`,
    `client` and `control` are carried the same way.
    """

    slot: SlotInfo
    round: int  # the round's number
    group: dist.ProcessGroup
    device: torch.device
    events: MembershipEvents = field(default_factory=MembershipEvents)
    timeout: float = 1800.0  # seconds a collective may take (--collective-timeout)
    # How the worker talks to its driver: set by `init()`, None in a context made by hand
    # (in-process tests that form a group without a driver).
    config: WorkerConfig | None = None  # the environment elasticrun set
    client: DriverClient | None = None  # HTTP: the rendezvous and the key-value store
    control: ControlClient | None = None  # gRPC: registration, heartbeats, events, leaving
    on_commit: Callable[[int], None] | None = None  # told each state commit's count
    # told each durable write's outcome: (the newest commit written, whether this one failed)
    on_durable: Callable[[int, bool], None] | None = None
    job_commit: int = 0  # the newest commit count the driver knew of when this round formed
    store: dist.Store | None = None  # this round's store (the driver's KV under its prefix)
    peers: PeerWatch | None = None  # probes the peers of a collective that stays blocked
    in_flight: InFlight = field(default_factory=InFlight)  # named async calls not yet done
    # groups formed in this round before this one: init() after shutdown() forms another
    formation: int = 0

    @property
    def rank(self) -> int:
        return self.slot.rank

    @property
    def size(self) -> int:
        return self.slot.size


@dataclass
class ProcessWide:
    """What outlives rounds in a worker process: settings made once, process sets defined."""

    collective_checks: bool | None = None  # None: from the environment (see collectives/checks.py)
    process_sets: list[Any] = field(default_factory=list)  # ProcessSets added, in order
    # weak references to DistributedOptimizers' gradient reducers, in order of creation
    optimizers: list[Any] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)  # what its heartbeats say it does
    # an optimizer step was applied and not yet booked (see training/step_boundary.py)
    step_pending: bool = False
    # Between `shutdown()` and the next `init()`: the context of the round it left, its group
    # released. The worker is still a member of the job (its driver connections, heartbeats
    # and events are kept); `init()` takes this up again.
    dormant: WorkerContext | None = None


_current: WorkerContext | None = None
_process = ProcessWide()
_graveyard: list[Any] = []  # abandoned process groups, kept alive (see group/process_group.py)


def current(what: str = "this call") -> WorkerContext:
    """Return the active context; raise `NotInitializedError` naming `what` if there is none."""
    if _current is None:
        raise NotInitializedError(what)
    return _current


def process_wide() -> ProcessWide:
    """The process's settings and definitions that outlive rounds (a worker has one)."""
    return _process


def is_initialized() -> bool:
    return _current is not None


def bury(group: Any) -> None:
    """Keep an abandoned process group referenced for the rest of the process's life, and
    through interpreter exit: its destructor would join threads that may still be blocked on
    a silent peer (a vanished or partitioned host never closes its connections), holding the
    exit until the collective timeout, or aborting it. The reference is never released, so
    that destructor never runs; the process's end reclaims the group."""
    _graveyard.append(group)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


def has_abandoned_groups() -> bool:
    """Whether a process group was abandoned (`bury`) in this process."""
    return bool(_graveyard)


def activate(ctx: WorkerContext | None) -> None:
    """Install `ctx` as the process-wide context (None clears it)."""
    global _current
    _current = ctx
