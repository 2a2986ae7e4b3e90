"""Which commit a re-formed round goes on from, and which survivor supplies each shard. Pure.

At a re-form every rank says what it holds (`Held`: for each commit it keeps, the old ranks
whose shards it holds whole, its own included). The round goes on from the newest commit
whose every shard some rank holds (`choose`); each old shard is supplied by the rank that
took it where that rank survives, else by the least loaded replica holder. A joiner holds
nothing and only receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Choice", "Held", "SlotId", "choose", "describe_loss"]


@dataclass(frozen=True, order=True)
class SlotId:
    """A commit as some round's ranks took it: its count and the round it was taken in (a
    re-formed round re-takes the commit it went on from, under the same or a higher count)."""

    commit: int
    round: int


@dataclass(frozen=True)
class Held:
    """What one rank keeps of one commit: the old ranks (of the `world` ranks that took it)
    whose shards it holds whole, and which of them was itself (`own`, None for replicas
    only). `origin` is the count of the commit whose values the slot holds (a re-taken
    commit keeps its origin's)."""

    slot: SlotId
    origin: int
    world: int
    ranks: frozenset[int]
    own: int | None = None


@dataclass(frozen=True)
class Choice:
    """The commit to go on from, and for each of its `world` old shards the rank of the new
    round that supplies it (`sources[k]`)."""

    slot: SlotId
    origin: int
    world: int
    sources: tuple[int, ...]
    reason: str


def choose(held_by: Sequence[Sequence[Held]]) -> Choice | None:
    """The newest commit whose every shard is held by some rank (`held_by[r]`: what rank r of
    the new round holds), with its sources; None when no commit is held whole (or none is
    held at all)."""
    slots: dict[SlotId, list[tuple[int, Held]]] = {}
    for rank, held in enumerate(held_by):
        for item in held:
            slots.setdefault(item.slot, []).append((rank, item))
    for slot in sorted(slots, reverse=True):
        holders = slots[slot]
        world = holders[0][1].world
        covered = set().union(*(item.ranks for _, item in holders))
        if not covered.issuperset(range(world)):
            continue
        sources = _sources(world, holders)
        return Choice(
            slot, holders[0][1].origin, world, sources, _reason(slot, world, sources, holders)
        )
    return None


def _sources(world: int, holders: list[tuple[int, Held]]) -> tuple[int, ...]:
    owners = {item.own: rank for rank, item in holders if item.own is not None}
    load: dict[int, int] = {}
    sources = []
    for old in range(world):
        if old in owners:
            source = owners[old]
        else:
            candidates = [rank for rank, item in holders if old in item.ranks]
            source = min(candidates, key=lambda rank: (load.get(rank, 0), rank))
        load[source] = load.get(source, 0) + 1
        sources.append(source)
    return tuple(sources)


def _reason(slot: SlotId, world: int, sources: Sequence[int], holders: list) -> str:
    owners = {item.own: rank for rank, item in holders if item.own is not None}
    from_replicas = [
        f"{old} from rank {src}" for old, src in enumerate(sources) if old not in owners
    ]
    how = "every shard from the rank that took it"
    if from_replicas:
        how = "shard(s) of " + ", ".join(from_replicas) + " from replicas"
    return f"commit {slot.commit} (taken by {world} rank(s) in round {slot.round}): {how}"


def describe_loss(held_by: Sequence[Sequence[Held]], replicas: int) -> str:
    """One line saying why no commit is held whole: the newest commit and its shards that no
    rank of the new round holds."""
    newest: Held | None = None
    covered: set[int] = set()
    for held in held_by:
        for item in held:
            if newest is None or item.slot > newest.slot:
                newest, covered = item, set()
            if item.slot == newest.slot:
                covered |= item.ranks
    if newest is None:
        return "no worker of the new round holds any commit"
    missing = sorted(set(range(newest.world)) - covered)
    return (
        f"commit {newest.slot.commit} (round {newest.slot.round}) is lost: no worker left holds "
        f"the shards of rank(s) {', '.join(map(str, missing))} of its {newest.world}; more hosts "
        f"were lost at once than replicas={replicas} covers"
    )
