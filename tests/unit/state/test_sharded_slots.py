"""The commits a rank keeps (`Slots`): blocks hold copies, a dropped commit's GPU block leaves
its pinned buffer as the one spare, and CPU blocks never do (a CPU model may train in a block
it was restored from). The spare's reuse by a GPU commit is checked in
tests/gpu/test_sharded_slots_gpu.py."""

from __future__ import annotations

import torch

from elastic.state.sharded.recovery_plan import SlotId
from elastic.state.sharded.slots import Block, Slot, Slots
from elastic.state.sharded.snapshot import Manifest


def slot(number: int, block: Block, own: int | None = 0, rank: int = 0) -> Slot:
    return Slot(SlotId(number, 1), number, 1, Manifest([], {}), own, {rank: block})


def test_a_block_holds_copies_that_training_does_not_change() -> None:
    weights = torch.arange(6, dtype=torch.float32)
    block = Slots().pack([weights, weights.to(torch.int16)], b"plain")
    weights += 100
    assert block.tensors[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert block.tensors[1].dtype == torch.int16 and block.plain == b"plain"


def test_a_dropped_cpu_commit_leaves_no_spare_buffer() -> None:
    slots = Slots()
    first = slots.pack([torch.ones(1000)], b"")
    slots.add(slot(1, first))
    slots.add(slot(2, slots.pack([torch.ones(1000)], b"")))
    slots.keep_only([SlotId(2, 1)])
    assert not first.spare_when_dropped
    assert slots.nbytes() == first.nbytes(), "only the kept commit's block is held"


def test_a_dropped_gpu_block_stays_as_the_spare_and_counts_as_held() -> None:
    """A block marked as a GPU commit's (pinned memory cannot be had without CUDA)."""
    slots = Slots()
    gpu_block = Block.pack([torch.ones(1000)], b"")
    gpu_block.spare_when_dropped = True
    replica = Block.pack([torch.ones(10)], b"")
    replica.spare_when_dropped = True  # a replica's buffer is never the spare: not own
    slots.add(slot(1, gpu_block))
    slots.add(slot(2, replica, own=None, rank=1))
    slots.add(slot(3, Block.pack([torch.ones(500)], b"")))
    slots.keep_only([SlotId(3, 1)])
    assert [held.slot for held in slots.held()] == [SlotId(3, 1)]
    assert slots.nbytes() == 4032 + 2048, "the kept block and the spare"
