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
    """Start the allreduce of a sparse COO tensor, as Horovod: indices and values are
    allgathered (named `NAME.indices` and `NAME.values`), so the result holds every rank's
    entries (duplicates add up when it is coalesced); Average divides the values by the
    number of ranks. Returns a handle that is called, as Horovod's (`handle()`), or passed to
    `synchronize()`; both return the sparse result."""
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
