"""`reshard` in a real Gloo group of three processes: the shards of tensors of several dtypes
and row counts, laid out for two old ranks and supplied by a holder or a replica, arrive laid
out for three bit for bit, whether the tensors move in one batch or in many (`BATCH_BYTES`
made tiny), and with a tensor whose rows stay where they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from elastic.state.sharded import resharding
from elastic.state.sharded.recovery_plan import Choice, SlotId
from elastic.state.sharded.rows import row_range
from elastic.state.sharded.slots import Block
from elastic.state.sharded.snapshot import TensorMeta
from tests.support.worker_group import run_group

SHAPES = [
    ((7, 3), torch.float32),
    ((5,), torch.bfloat16),
    ((11, 2), torch.int64),
    ((1, 4), torch.float64),
]


def whole(index: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    values = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64) * (index + 1)
    return values.reshape(shape).to(dtype)


def _move(batch_bytes: int, sources: tuple[int, ...]) -> list[torch.Tensor]:
    import torch.distributed as dist

    resharding.BATCH_BYTES = batch_bytes  # this process only
    rank = dist.get_rank()
    metas = [TensorMeta(shape, whole(0, shape, d).stride(), d) for shape, d in SHAPES]
    held = {}
    for old_rank in range(2):  # old rank k's block, where this rank supplies it
        if sources[old_rank] == rank:
            parts = []
            for index, (shape, dtype) in enumerate(SHAPES):
                start, stop = row_range(shape[0], 2, old_rank)
                parts.append(whole(index, shape, dtype)[start:stop])
            held[old_rank] = Block.pack(parts, b"")
    choice = Choice(SlotId(1, 1), 1, 2, sources, "a test")
    return resharding.reshard(choice, metas, held, rank, 3, dist.group.WORLD)


@pytest.mark.parametrize("batch_bytes", [64 << 20, 8], ids=["one batch", "a batch per tensor"])
@pytest.mark.parametrize("sources", [(0, 1), (2, 0)], ids=["takers", "a replica and a joiner"])
def test_shards_of_two_old_ranks_arrive_laid_out_for_three(
    batch_bytes: int, sources: tuple[int, ...]
) -> None:
    results: list[Any] = run_group(_move, 3, batch_bytes, sources, timeout=120)
    for rank, blocks in enumerate(results):
        for index, (shape, dtype) in enumerate(SHAPES):
            start, stop = row_range(shape[0], 3, rank)
            expected = whole(index, shape, dtype)[start:stop]
            assert blocks[index].dtype == dtype and blocks[index].shape == expected.shape
            assert torch.equal(blocks[index], expected), (rank, index)
