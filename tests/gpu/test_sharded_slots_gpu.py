"""ShardedState's commits of GPU tensors on a real GPU (`Slots.pack`): in pinned host memory,
copied bit for bit, and from the second commit on into the buffer of the commit dropped
before (no new pinned allocation per commit). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from elastic.state.sharded.recovery_plan import SlotId
from elastic.state.sharded.slots import Slot, Slots
from elastic.state.sharded.snapshot import Manifest

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_gpu_commits_are_pinned_exact_copies_and_reuse_the_dropped_commits_buffer() -> None:
    weights = torch.randn(1 << 20, device="cuda")
    moments = torch.randn(1 << 20, device="cuda").to(torch.bfloat16)
    slots, buffers = Slots(), []
    for number in range(1, 5):
        weights.add_(1.0)  # training between commits
        block = slots.pack([weights, moments], b"plain values")
        assert block.flat.is_pinned()
        assert torch.equal(block.tensors[0], weights.cpu())
        assert torch.equal(block.tensors[1].view(torch.int16), moments.cpu().view(torch.int16))
        slots.add(Slot(SlotId(number, 1), number, 1, Manifest([], {}), 0, {0: block}))
        slots.keep_only([SlotId(number, 1)])
        buffers.append(block.flat.data_ptr())
    assert buffers[2] == buffers[0] and buffers[3] == buffers[1], "two buffers, alternating"
    assert slots.nbytes() == 2 * block.nbytes(), "the newest commit and the spare"
