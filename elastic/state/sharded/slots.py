"""The commits a rank keeps in host memory: its own blocks and the replicas it holds.

A rank keeps at most two commits: the newest, and the one before it until the newest is
replicated on every rank (then `Slots.keep_only` drops the older). A replica counts as held
only once all of it has arrived, so `held()` never claims a block half received. The
replication thread adds replicas while the training thread takes commits: every method
takes the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from elastic.state.sharded.recovery_plan import Held, SlotId
from elastic.state.sharded.snapshot import Manifest

__all__ = ["Block", "Slot", "Slots"]


@dataclass
class Block:
    """One rank's part of a commit: its rows of every sharded tensor (in manifest order)
    and its plain state (plain values and samplers, pickled)."""

    tensors: list[torch.Tensor]
    plain: bytes

    def nbytes(self) -> int:
        return len(self.plain) + sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class Slot:
    """One commit as this rank keeps it: `blocks[k]` for each old rank k held whole."""

    id: SlotId
    origin: int  # the commit whose values it holds (see `Held`)
    world: int
    manifest: Manifest
    own: int | None  # the rank this rank was when it took the commit; None: replicas only
    blocks: dict[int, Block] = field(default_factory=dict)

    def held(self) -> Held:
        return Held(self.id, self.origin, self.world, frozenset(self.blocks), self.own)


class Slots:
    """The commits this rank keeps, safe to use from two threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[SlotId, Slot] = {}

    def add(self, slot: Slot) -> None:
        with self._lock:
            self._slots[slot.id] = slot

    def add_replica(self, slot_id: SlotId, rank: int, block: Block) -> None:
        """Record `rank`'s block of `slot_id` as held whole (dropped if the slot is gone)."""
        with self._lock:
            if (slot := self._slots.get(slot_id)) is not None:
                slot.blocks[rank] = block

    def keep_only(self, keep: Iterable[SlotId]) -> None:
        """Drop every commit but those in `keep`."""
        wanted = set(keep)
        with self._lock:
            self._slots = {key: slot for key, slot in self._slots.items() if key in wanted}

    def get(self, slot_id: SlotId) -> Slot | None:
        with self._lock:
            return self._slots.get(slot_id)

    def held(self) -> list[Held]:
        with self._lock:
            return [slot.held() for slot in self._slots.values()]

    def nbytes(self) -> int:
        with self._lock:
            return sum(b.nbytes() for slot in self._slots.values() for b in slot.blocks.values())
