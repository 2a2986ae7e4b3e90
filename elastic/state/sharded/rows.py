"""Which rows of a tensor sharded on dimension 0 each rank holds, and what moves where when
the number of ranks changes. Pure arithmetic, no torch.

FSDP2 (`fully_shard`) shards every parameter as `torch.chunk` does: over `world` ranks each
rank gets `ceil(rows / world)` rows, in rank order, and the last ranks get fewer or none
(7 rows over 4 ranks: 2, 2, 2, 1; 5 rows over 4 ranks: 2, 2, 1, 0). Optimizer state
follows its parameter's sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Piece", "pieces", "row_range"]


def row_range(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows `[start, stop)` that `rank` of `world` holds of a tensor with `rows` rows
    (FSDP2's chunking); `start == stop` when it holds none. Raises ValueError for a rank
    outside the world or a world under 1."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of a world of {world}")
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


@dataclass(frozen=True, order=True)
class Piece:
    """Rows `[start, stop)` of a tensor that `new_rank` of the new layout takes from the shard
    that `old_rank` held in the old layout, supplied by `source` (a rank of the new round
    that holds that old shard: its taker or a replica holder)."""

    new_rank: int
    start: int
    stop: int
    old_rank: int
    source: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def pieces(rows: int, old_world: int, new_world: int, sources: Sequence[int]) -> list[Piece]:
    """Every non-empty piece that moves a tensor of `rows` rows from its layout over
    `old_world` ranks to its layout over `new_world` ranks, sorted by new rank then row;
    `sources[k]` is the new rank that supplies old rank k's shard. Together the pieces of a
    new rank cover its `row_range` exactly once."""
    if len(sources) != old_world:
        raise ValueError(f"{len(sources)} sources for {old_world} old shards")
    out: list[Piece] = []
    for new_rank in range(new_world):
        start, stop = row_range(rows, new_world, new_rank)
        for old_rank in range(old_world):
            old_start, old_stop = row_range(rows, old_world, old_rank)
            low, high = max(start, old_start), min(stop, old_stop)
            if low < high:
                out.append(Piece(new_rank, low, high, old_rank, sources[old_rank]))
    return out
