"""Row ranges under FSDP2's chunking, and the pieces that move a tensor from one world size to
another: every old/new pair of sizes 1..6, row counts that do not divide evenly."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from elastic.state.sharded.rows import pieces, row_range

ROWS = [0, 1, 2, 5, 7, 13, 24]
WORLDS = range(1, 7)


def chunks(data: torch.Tensor, world: int) -> list[torch.Tensor]:
    """What FSDP2 gives each rank: torch.chunk's pieces, then empty ones."""
    parts = list(data.chunk(world)) if len(data) else []
    return parts + [data[:0]] * (world - len(parts))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("world", WORLDS)
def test_row_ranges_are_fsdp2_s_chunks(rows: int, world: int) -> None:
    data = torch.arange(rows)
    for rank, part in enumerate(chunks(data, world)):
        start, stop = row_range(rows, world, rank)
        assert data[start:stop].tolist() == part.tolist()


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 3 of a world of 3"):
        row_range(5, 3, 3)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("old", "new"), list(itertools.product(WORLDS, WORLDS)))
def test_pieces_rebuild_every_new_shard_from_the_old_ones(rows: int, old: int, new: int) -> None:
    data = torch.arange(rows * 3).reshape(rows, 3)
    old_shards = chunks(data, old)
    sources = [random.Random(rows * 100 + old * 10 + new).randrange(new) for _ in range(old)]
    moved = pieces(rows, old, new, sources)
    rebuilt = [torch.full((row_range(rows, new, r)[1] - row_range(rows, new, r)[0], 3), -1)
               for r in range(new)]  # fmt: skip
    for piece in moved:
        assert piece.rows > 0 and piece.source == sources[piece.old_rank]
        old_start, _ = row_range(rows, old, piece.old_rank)
        new_start, _ = row_range(rows, new, piece.new_rank)
        target = rebuilt[piece.new_rank][piece.start - new_start : piece.stop - new_start]
        assert (target == -1).all(), "each row is written once"
        target.copy_(old_shards[piece.old_rank][piece.start - old_start : piece.stop - old_start])
    assert [shard.tolist() for shard in rebuilt] == [s.tolist() for s in chunks(data, new)]


def test_pieces_need_one_source_per_old_shard() -> None:
    with pytest.raises(ValueError, match="2 sources for 3 old shards"):
        pieces(7, 3, 2, [0, 1])
