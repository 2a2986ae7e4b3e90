"""The commits a rank keeps in host memory: its own blocks and the replicas it holds.

A rank keeps at most two commits: the newest, and the one before it until the newest is
replicated on every rank (then `Slots.keep_only` drops the older). A replica counts as held
only once all of it has arrived, so `held()` never claims a block half received. The
replication thread adds replicas while the training thread takes commits: every method
takes the lock.

A commit of GPU tensors goes into pinned host memory, which a copy from the GPU fills at the
bus's speed (a new pageable buffer per commit costs page faults and a slower copy: 6.7 GB/s on
an H200). Pinning is slow to set up, so the buffer of this rank's block of a dropped commit
is kept as a spare (one at most) and the next commit of the same size fills it: between
commits a rank holds its newest block and one spare, as much as it holds at a commit's peak.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from elastic.state.sharded.recovery_plan import Held, SlotId
from elastic.state.sharded.snapshot import Manifest

__all__ = ["Block", "Slot", "Slots"]


_ALIGN = 64  # bytes: every tensor of a block starts at a multiple, so any dtype views it


@dataclass
class Block:
    """One rank's part of a commit: its rows of every sharded tensor (in manifest order) and
    its plain state (plain values and samplers, pickled), all in one flat byte buffer
    (`flat`: the tensors, each aligned, then the plain bytes, then padding to the
    alignment), which is what replication sends; `tensors` are views into it."""

    tensors: list[torch.Tensor]
    plain: bytes
    flat: torch.Tensor
    spare_when_dropped: bool = False  # its buffer becomes `Slots`' spare (pinned memory)

    def nbytes(self) -> int:
        return self.flat.numel()

    @staticmethod
    def size_for(tensors: Sequence[torch.Tensor], plain: bytes) -> int:
        """The bytes of the buffer `pack` fills for `tensors` and `plain`."""
        return _aligned(block_layout([(t.shape, t.dtype) for t in tensors], len(plain))[-1])

    @classmethod
    def pack(
        cls, tensors: Sequence[torch.Tensor], plain: bytes, flat: torch.Tensor | None = None
    ) -> Block:
        """A block holding copies of `tensors` (any device: copied to host memory) and
        `plain`, in `flat` (`size_for` bytes; reused, whatever it held) or a new buffer. Copies
        from a GPU into pinned memory run asynchronously and are finished when it returns."""
        layout = block_layout([(t.shape, t.dtype) for t in tensors], len(plain))
        if flat is None:
            flat = torch.zeros(_aligned(layout[-1]), dtype=torch.uint8)
        views = _views(flat, [(t.shape, t.dtype) for t in tensors], layout)
        devices = set()
        for view, tensor in zip(views, tensors, strict=True):
            asynchronous = tensor.device.type == "cuda" and flat.is_pinned()
            view.copy_(tensor.detach(), non_blocking=asynchronous)
            if asynchronous:
                devices.add(tensor.device)
        for device in devices:
            torch.cuda.synchronize(device)
        if plain:
            flat[layout[-2] : layout[-1]] = torch.frombuffer(bytearray(plain), dtype=torch.uint8)
        return cls(views, plain, flat)

    @classmethod
    def unpack(cls, flat: torch.Tensor, specs: Sequence[TensorSpec], plain: int) -> Block:
        """The block whose buffer is `flat` (as `pack` lays it out, starting at an aligned
        address), for tensors of `specs` (shape, dtype) and `plain` bytes of plain state:
        views, no copy."""
        layout = block_layout(specs, plain)
        return cls(
            _views(flat, specs, layout), flat[layout[-2] : layout[-1]].numpy().tobytes(), flat
        )


TensorSpec = tuple[Sequence[int], torch.dtype]


def block_layout(specs: Sequence[TensorSpec], plain: int) -> list[int]:
    """Where each tensor of `specs` starts in a block's buffer, then where the plain bytes
    start, then the buffer's length (with `plain` bytes of them)."""
    offsets, offset = [], 0
    for shape, dtype in specs:
        offsets.append(offset)
        size = _numel(shape) * dtype.itemsize
        offset += _aligned(size)
    return [*offsets, offset, offset + plain]


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def _views(flat: torch.Tensor, specs: Sequence[TensorSpec], layout: list[int]) -> list:
    out = []
    for (shape, dtype), start in zip(specs, layout, strict=False):
        size = _numel(shape) * dtype.itemsize
        out.append(flat[start : start + size].view(dtype).view(tuple(shape)))
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


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
        self._spare: torch.Tensor | None = None  # a dropped block's pinned buffer

    def pack(self, tensors: Sequence[torch.Tensor], plain: bytes) -> Block:
        """This rank's block of a new commit (`Block.pack`). Of GPU tensors: in pinned host
        memory, the spare buffer when it has the size (else a new one; pageable memory if no
        pinned memory is to be had), which goes back to spare when its commit is dropped."""
        if not any(t.device.type == "cuda" for t in tensors):
            return Block.pack(tensors, plain)
        size = Block.size_for(tensors, plain)
        with self._lock:
            flat, self._spare = self._spare, None
        if flat is None or flat.numel() != size:
            flat = None  # a spare of another size (the state grew or re-sharded) goes
            try:
                flat = torch.zeros(size, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # no pinned memory to be had: pageable memory works, slower
                return Block.pack(tensors, plain)
        block = Block.pack(tensors, plain, flat)
        block.spare_when_dropped = True
        return block

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
            for key, slot in self._slots.items():
                own = slot.blocks.get(slot.own) if slot.own is not None else None
                if key not in wanted and own is not None and own.spare_when_dropped:
                    self._spare = own.flat
            self._slots = {key: slot for key, slot in self._slots.items() if key in wanted}

    def get(self, slot_id: SlotId) -> Slot | None:
        with self._lock:
            return self._slots.get(slot_id)

    def held(self) -> list[Held]:
        with self._lock:
            return [slot.held() for slot in self._slots.values()]

    def nbytes(self) -> int:
        """The host memory the commits hold: every block kept, and the spare buffer."""
        with self._lock:
            spare = 0 if self._spare is None else self._spare.numel()
            return spare + sum(
                b.nbytes() for slot in self._slots.values() for b in slot.blocks.values()
            )
