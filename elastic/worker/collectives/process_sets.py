"""Process sets (Horovod's): collectives limited to a subset of the job's ranks.

A process set names ranks of the job. Its torch.distributed group is formed among its
members the first time a collective of a round uses it, and again in each later round, so a
set survives re-forms. Ranks are the round's: after a shrink, members at or beyond the new
size are out of the set until the job grows back. Every rank adds the same sets in the same
order, as with Horovod's dynamic process sets; a collective on a set is called by its
members only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from elastic.worker import context
from elastic.worker.context import WorkerContext
from elastic.worker.errors import CollectiveArgumentError
from elastic.worker.group.process_group import abort_nccl

__all__ = [
    "ProcessSet",
    "Scope",
    "add_process_set",
    "clear_process_sets",
    "global_process_set",
    "remove_process_set",
    "scope",
]


class ProcessSet:
    """A set of the job's ranks (all of them for `global_process_set`).

    `process_set_id` is None until `add_process_set` registers the set (0 for the global
    one). `size()`, `rank()` and `included()` describe the current round.
    """

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        if ranks is not None and not all(isinstance(r, int) and r >= 0 for r in ranks):
            raise ValueError(f"a process set's ranks are non-negative integers, not {ranks!r}")
        self._ranks = None if ranks is None else tuple(sorted(set(ranks)))
        self.process_set_id: int | None = 0 if ranks is None else None
        self._round = -1
        self._group: dist.ProcessGroup | None = None

    @property
    def ranks(self) -> list[int]:
        """The set's ranks in the current round (for the global set: every rank)."""
        ctx = context.current("ProcessSet.ranks")
        if self._ranks is None:
            return list(range(ctx.size))
        return [r for r in self._ranks if r < ctx.size]

    def size(self) -> int:
        """How many of the set's ranks the current round has."""
        return len(self.ranks)

    def rank(self) -> int:
        """This worker's index among the set's ranks; -1 when it is not in the set."""
        ranks = self.ranks
        me = context.current("ProcessSet.rank").rank
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        """Whether this worker is in the set in the current round."""
        return self.rank() >= 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and self._ranks == other._ranks

    def __hash__(self) -> int:
        return hash(self._ranks)

    def __repr__(self) -> str:
        shown = "all ranks" if self._ranks is None else f"ranks={list(self._ranks)}"
        return f"ProcessSet(process_set_id={self.process_set_id}, {shown})"

    def _group_in(self, ctx: WorkerContext, members: tuple[int, ...]) -> dist.ProcessGroup:
        """This set's group in `ctx`'s round, formed among `members` on first use."""
        if self._ranks is None or len(members) == ctx.size:
            return ctx.group
        if self._round != ctx.round or self._group is None:
            if self._group is not None:
                abort_nccl(self._group)
                context.bury(self._group)  # its round's collectives may still be blocked
            self._group = dist.new_group(
                list(members),
                timeout=timedelta(seconds=ctx.timeout),
                use_local_synchronization=True,
            )
            self._round = ctx.round
        return self._group


global_process_set = ProcessSet()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (or the set of these ranks) and return it, with its id.

    Every rank must add the same sets in the same order. Raises `ValueError` for a set
    already added or one with the same ranks."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    registry = context.process_wide().process_sets
    if ps._ranks is None or ps in registry:
        raise ValueError(f"{ps!r} is already a registered process set")
    ps.process_set_id = 1 + max((p.process_set_id or 0 for p in registry), default=0)
    registry.append(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister `process_set`; False if it was not registered (or is the global set)."""
    registry = context.process_wide().process_sets
    if process_set._ranks is None or process_set not in registry:
        return False
    registry.remove(process_set)
    process_set.process_set_id = None
    return True


def clear_process_sets(keep_groups_alive: bool) -> None:
    """Unregister every process set, as Horovod's `shutdown()` does: each one's id becomes
    None and its group is forgotten; after the next `init()` the global set is the only one
    and ids start again at 1 (a set may be added again). `keep_groups_alive`: the round's
    default group is abandoned, not destroyed (a collective may still be blocked), and so
    are the sets' groups (`context.bury`)."""
    registry = context.process_wide().process_sets
    for process_set in registry:
        if keep_groups_alive and process_set._group is not None:
            abort_nccl(process_set._group)
            context.bury(process_set._group)
        process_set.process_set_id = None
        process_set._group, process_set._round = None, -1
    registry.clear()


@dataclass(frozen=True)
class Scope:
    """Where one collective runs: the group, its members (job ranks), this worker's index."""

    group: dist.ProcessGroup
    members: tuple[int, ...]
    rank: int

    @property
    def size(self) -> int:
        return len(self.members)


def scope(ctx: WorkerContext, process_set: ProcessSet, what: str) -> Scope:
    """The scope of a collective on `process_set` in `ctx`'s round.

    Raises `CollectiveArgumentError` when the set was never added (or removed) or this worker
    is not one of its members in this round."""
    if process_set._ranks is None:
        return Scope(ctx.group, tuple(range(ctx.size)), ctx.rank)
    if process_set not in context.process_wide().process_sets:
        raise CollectiveArgumentError(
            f"{what}: {process_set!r} is not registered: call hvd.add_process_set first"
        )
    members = tuple(process_set.ranks)
    if ctx.rank not in members:
        raise CollectiveArgumentError(
            f"{what}: rank {ctx.rank} is not in {process_set!r} in round {ctx.round}"
        )
    return Scope(process_set._group_in(ctx, members), members, members.index(ctx.rank))
