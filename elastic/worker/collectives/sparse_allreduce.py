"""Horovod's `sparse_allreduce_async`: the allreduce of a sparse COO tensor, made of two
allgathers (its indices and its values)."""

from __future__ import annotations

import torch

from elastic.worker.collectives.allgathers import allgather_async
from elastic.worker.collectives.handles import Handle
from elastic.worker.collectives.process_sets import ProcessSet, global_process_set
from elastic.worker.collectives.reduce_ops import Average, Sum, resolve_op

__all__ = ["sparse_allreduce_async"]


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None,
    op: int | None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start the allreduce of a sparse COO tensor, as Horovod: its indices and values are
    allgathered, so the result holds every rank's entries (duplicates add up when it is
    coalesced).

    Args:
        tensor: this rank's sparse tensor; every member's has the same dense shape.
        name: the key of the two allgathers (`NAME.indices`, `NAME.values`), as `allgather`'s.
        op: `Average` (the values divided by the number of ranks) or `Sum`.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        A `Handle`, called (`handle()`, as Horovod's) or passed to `synchronize()`: both return
        the sparse result.

    Raises:
        NotImplementedError: an op other than Average and Sum.
        CollectiveArgumentError, NotInitializedError: as `allgather`, from this call.
        WorkerLostError, RuntimeError: as `allgather`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    resolved = resolve_op(op, None)
    if resolved not in (Average, Sum):
        raise NotImplementedError("sparse_allreduce_async supports only Average and Sum")
    source = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(
        source.indices().t().contiguous(),
        name=None if name is None else f"{name}.indices",
        process_set=process_set,
    )
    values = allgather_async(
        source.values(),
        name=None if name is None else f"{name}.values",
        process_set=process_set,
    )
    size = len(process_set.ranks)

    def finish() -> torch.Tensor:
        gathered_values = values._complete()
        gathered_indices = indices._complete()
        if resolved == Average:
            gathered_values = gathered_values / size
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, source.shape)

    return Handle(([], finish), parts=(indices, values))
