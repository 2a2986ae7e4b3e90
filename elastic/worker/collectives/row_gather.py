"""Allgathering rows whose number differs between ranks, without the cross-rank check: the
core that allgather, `allgather_object`, reducescatter's gradient and `DistributedOptimizer`'s
sparse gradients share.

Any dtype moves: those a backend lacks travel as their bytes (`wire_dtypes.as_bytes`). The
ranks must already agree on the call (a checked collective did, or the callers' shapes
agree by construction). A lost peer or a broken round raises `WorkerLostError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elastic.worker.collectives.checks import DIM0
from elastic.worker.collectives.handles import Pending, complete, wait
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.collectives.wire_dtypes import as_bytes
from elastic.worker.torch_versions import all_gather_single

__all__ = ["first_dims", "gather_ints", "gather_rows", "start_gather"]


def gather_ints(where: Scope, values: list[int]) -> list[list[int]]:
    """Blocking allgather of a few integers per rank; rows in the scope's order."""
    mine = torch.tensor(values, dtype=torch.int64)
    out = torch.empty(where.size * len(values), dtype=torch.int64)
    wait(all_gather_single(out, mine, group=where.group, async_op=True))
    return out.view(where.size, len(values)).tolist()


def start_gather(where: Scope, tensor: torch.Tensor, dims: list[int]) -> Pending:
    """Launch the allgather of `tensor` whose first dimension on each rank is `dims[r]`; the
    pending result is the concatenation in rank order."""
    source, restore = as_bytes(tensor)
    longest = max(dims)
    rest = source.shape[1:]
    if longest * rest.numel() == 0:
        return [], lambda: restore(source.new_empty((sum(dims), *rest)))
    even = all(d == longest for d in dims)
    if even:
        send = source
    else:
        send = source.new_empty((longest, *rest))
        send[: source.shape[0]].copy_(source)
    out = source.new_empty((where.size * longest, *rest))
    works = [all_gather_single(out, send, group=where.group, async_op=True)]

    def finish() -> torch.Tensor:
        if even:
            return restore(out)
        return restore(torch.cat([out[r * longest : r * longest + d] for r, d in enumerate(dims)]))

    return works, finish


def gather_rows(where: Scope, tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """Allgather `tensor` (first dimension `dims[r]` on rank r) without checks: for the
    gradients of other collectives, whose shapes the ranks already agreed on."""
    return complete(start_gather(where, tensor, dims))


def first_dims(where: Scope, tensors: Sequence[torch.Tensor], rows: list[list[int]] | None):
    """Every rank's first dimensions of `tensors`: from the check's rows when it ran and
    there is one tensor, else exchanged."""
    if rows is not None and len(tensors) == 1:
        return [[row[DIM0]] for row in rows]
    return gather_ints(where, [t.shape[0] for t in tensors])
