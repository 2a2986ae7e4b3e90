"""Horovod's allgather and grouped allgather over `torch.distributed`: every rank's rows,
concatenated in rank order.

Dimension 0 may differ between ranks; the other dimensions and the dtype must match. A
direct call first agrees with the other ranks on its arguments (`negotiation.py`); a
mismatch (dtype, shape beyond dimension 0, name), or a tensor without dimensions, raises the
same `CollectiveArgumentError` on every rank. A lost peer or a broken round raises
`WorkerLostError`.

Gradients (Horovod's definition): the gradient is averaged over the ranks, and each rank
takes its own rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.checks import Kind, scalar_problem
from elastic.worker.collectives.handles import Handle, Pending, complete
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set
from elastic.worker.collectives.reduce_ops import Average
from elastic.worker.collectives.row_gather import first_dims, start_gather
from elastic.worker.context import current

__all__ = ["allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async"]


class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged over ranks, then this rank's rows."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, where: Scope, dims: list[int], ps):
        fctx.dims, fctx.index, fctx.ps = dims, where.rank, ps
        return complete(start_gather(where, tensor, dims))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=fctx.ps)
        offset = sum(fctx.dims[: fctx.index])
        return reduced.narrow(0, offset, fctx.dims[fctx.index]), None, None, None


def allgather(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must match.

    Args:
        tensor: what this rank contributes, with at least one dimension; not modified.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        A new tensor, every member's rows in rank order; differentiable (the gradient is
        averaged over the ranks, each taking its own rows).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.allgather")
    what = "hvd.allgather"
    where, rows = checked(
        ctx,
        process_set,
        Kind.ALLGATHER,
        what,
        [tensor],
        name=name,
        problem=scalar_problem([tensor]),
    )
    dims = [row[0] for row in first_dims(where, [tensor], rows)]
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFunction.apply(tensor, where, dims, process_set)
    return complete(start_gather(where, tensor, dims))


def allgather_async(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `allgather` and return at once (the ranks' sizes are exchanged before it returns).

    Args:
        As `allgather`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the concatenated tensor.

    Raises:
        CollectiveArgumentError, NotInitializedError: as `allgather`, from this call.
        WorkerLostError, RuntimeError: as `allgather`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    ctx = current("hvd.allgather_async")

    def start(where: Scope, rows: list[list[int]] | None) -> Pending:
        return start_gather(where, tensor, [row[0] for row in first_dims(where, [tensor], rows)])

    return started(
        ctx, process_set, Kind.ALLGATHER, "hvd.allgather_async", [tensor], start,
        name=name, problem=scalar_problem([tensor]),
    )  # fmt: skip


def _start_grouped_gather(where: Scope, tensors: Sequence[torch.Tensor], rows) -> Pending:
    table = first_dims(where, tensors, rows)
    parts = [start_gather(where, t, [r[i] for r in table]) for i, t in enumerate(tensors)]
    works = [w for part_works, _ in parts for w in part_works]
    return works, lambda: [finish() for _, finish in parts]


class _GroupedAllgatherFunction(torch.autograd.Function):
    """Differentiable grouped allgather: each gradient as `allgather`'s."""

    @staticmethod
    def forward(fctx: Any, where: Scope, ps, *tensors: torch.Tensor):
        table = first_dims(where, tensors, None)
        fctx.table, fctx.index, fctx.ps = table, where.rank, ps
        parts = [start_gather(where, t, [r[i] for r in table]) for i, t in enumerate(tensors)]
        return tuple(complete(part) for part in parts)

    @staticmethod
    def backward(fctx: Any, *grads: torch.Tensor):
        results = []
        for i, grad in enumerate(grads):
            dims = [row[i] for row in fctx.table]
            reduced = allreduce(grad.contiguous(), op=Average, process_set=fctx.ps)
            results.append(reduced.narrow(0, sum(dims[: fctx.index]), dims[fctx.index]))
        return (None, None, *results)


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """`allgather` of each tensor of `tensors`.

    Args:
        tensors: what this rank contributes; not modified.
        Others: as `allgather`.

    Returns:
        A list of new tensors, one per tensor of `tensors`; differentiable.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.grouped_allgather")
    what = "hvd.grouped_allgather"
    kind = Kind.GROUPED_ALLGATHER
    where, rows = checked(
        ctx, process_set, kind, what, tensors, name=name, problem=scalar_problem(tensors)
    )
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_GroupedAllgatherFunction.apply(where, process_set, *tensors))
    return complete(_start_grouped_gather(where, tensors, rows))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `grouped_allgather` and return at once.

    Args:
        As `grouped_allgather`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the list of results.

    Raises:
        CollectiveArgumentError, NotInitializedError: as `allgather`, from this call.
        WorkerLostError, RuntimeError: as `allgather`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    ctx = current("hvd.grouped_allgather_async")
    return started(
        ctx, process_set, Kind.GROUPED_ALLGATHER, "hvd.grouped_allgather_async", tensors,
        lambda where, rows: _start_grouped_gather(where, tensors, rows),
        name=name, problem=scalar_problem(tensors),
    )  # fmt: skip
