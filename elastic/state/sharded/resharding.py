"""Moving a commit's shards from the ranks that hold them to the new round's layout.

One collective per sharded tensor, over the round's group (an `all_to_all_single` of rows,
as bytes): every supplier (`Choice.sources`) sends each new rank the rows of the old shards
it supplies that fall in that rank's new `row_range`, and every rank writes what it
receives into a new block. So the peak is one tensor's worth beyond the blocks, never the
whole model; where every row a rank needs is its own already, nothing moves. A joiner
holds nothing and only receives.

If a peer dies meanwhile, the collective raises `WorkerLostError` (the run loop re-joins
the next round, and the holders still hold what they held).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from elastic.state.sharded.recovery_plan import Choice
from elastic.state.sharded.rows import Piece, pieces, row_range
from elastic.state.sharded.slots import Block
from elastic.state.sharded.snapshot import TensorMeta
from elastic.worker.collectives.handles import wait

__all__ = ["reshard"]


def reshard(
    choice: Choice,
    metas: Sequence[TensorMeta],
    held: Mapping[int, Block],
    rank: int,
    world: int,
    group: dist.ProcessGroup,
) -> list[torch.Tensor]:
    """This rank's new block of every tensor of `metas` (the chosen commit's), laid out
    for `world` ranks; `held[k]` is old rank k's block where this rank supplies it.
    A collective: every rank of the round calls it with the same `choice` and `metas`."""
    out = []
    for index, meta in enumerate(metas):
        moves = pieces(meta.shape[0], choice.world, world, choice.sources)
        out.append(_move(index, meta, moves, choice.world, held, rank, world, group))
    return out


def _rows(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` as uint8 rows of `width` bytes: one per row of dimension 0, any dtype."""
    return tensor.contiguous().view(torch.uint8).reshape(tensor.shape[0], width)


def _move(
    index: int,
    meta: TensorMeta,
    moves: list[Piece],
    old_world: int,
    held: Mapping[int, Block],
    rank: int,
    world: int,
    group: dist.ProcessGroup,
) -> torch.Tensor:
    start, _ = row_range(meta.shape[0], world, rank)
    block = torch.empty(meta.local_shape(world, rank), dtype=meta.dtype)
    width = meta.local_bytes(1, 0) // max(meta.shape[0], 1)  # bytes per row
    if not moves or width == 0:  # no rows, or rows of no bytes: nothing to move
        return block
    mine = _rows(block, width)

    def source_rows(piece: Piece) -> torch.Tensor:
        old_start, _ = row_range(meta.shape[0], old_world, piece.old_rank)
        rows = _rows(held[piece.old_rank].tensors[index], width)
        return rows[piece.start - old_start : piece.stop - old_start]

    if all(piece.source == piece.new_rank for piece in moves):  # every row stays where it is
        for piece in moves:
            if piece.new_rank == rank:
                mine[piece.start - start : piece.stop - start] = source_rows(piece)
        return block
    sending = sorted((p for p in moves if p.source == rank), key=lambda p: (p.new_rank, p.start))
    receiving = sorted((p for p in moves if p.new_rank == rank), key=lambda p: (p.source, p.start))
    send_splits, recv_splits = [0] * world, [0] * world
    for piece in sending:
        send_splits[piece.new_rank] += piece.rows
    for piece in receiving:
        recv_splits[piece.source] += piece.rows
    outgoing = (
        torch.cat([source_rows(piece) for piece in sending])
        if sending
        else torch.empty((0, width), dtype=torch.uint8)
    )
    incoming = torch.empty((sum(recv_splits), width), dtype=torch.uint8)
    work = dist.all_to_all_single(
        incoming, outgoing, recv_splits, send_splits, group=group, async_op=True
    )
    wait(work)
    offset = 0
    for piece in receiving:
        mine[piece.start - start : piece.stop - start] = incoming[offset : offset + piece.rows]
        offset += piece.rows
    return block
