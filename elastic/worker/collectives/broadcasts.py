"""Horovod's broadcast over `torch.distributed`: job rank `root_rank`'s tensor on every rank,
in place or not, blocking or asynchronous.

Any dtype moves (`wire_dtypes.as_bytes`). A direct call first agrees with the other ranks on
its arguments (`negotiation.py`); different shapes, dtypes, root ranks or names, or a root
outside the call's ranks, raise the same `CollectiveArgumentError` on every rank. A lost peer
or a broken round raises `WorkerLostError`.

Gradient (Horovod's definition): the root gets the gradient averaged over the ranks, the
other ranks zeros.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.checks import Kind, check_root
from elastic.worker.collectives.handles import Handle, Pending, complete
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set
from elastic.worker.collectives.reduce_ops import Average
from elastic.worker.collectives.wire_dtypes import as_bytes
from elastic.worker.context import current

__all__ = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]


def _start_broadcast(where: Scope, tensor: torch.Tensor, root_rank: int, inplace: bool) -> Pending:
    """Launch the broadcast from job rank `root_rank`; the pending result is the received
    tensor (`tensor` itself when `inplace`)."""
    check_root(root_rank, where, "hvd.broadcast")
    is_root = where.members[where.rank] == root_rank
    if inplace or not is_root:
        target = tensor if inplace else torch.empty_like(tensor)
    else:
        target = tensor.clone(memory_format=torch.contiguous_format)
    buf, restore = as_bytes(target)
    works = []
    if buf.numel() > 0:
        src = where.members.index(root_rank)
        works.append(dist.broadcast(buf, group=where.group, group_src=src, async_op=True))

    def finish() -> torch.Tensor:
        received = restore(buf).view(target.shape)
        if received.data_ptr() != target.data_ptr() or received.stride() != target.stride():
            target.copy_(received)
        return target

    return works, finish


class _BroadcastFunction(torch.autograd.Function):
    """Differentiable broadcast: the root gets the averaged gradient, other ranks zeros."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, root_rank: int, where: Scope, ps):
        fctx.is_root, fctx.ps = where.members[where.rank] == root_rank, ps
        return complete(_start_broadcast(where, tensor, root_rank, False))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=fctx.ps)
        if not fctx.is_root:
            reduced.zero_()
        return reduced, None, None, None


def _broadcast_scope(what: str, tensor, root_rank, name, process_set):
    ctx = current(what)
    where, _ = checked(ctx, process_set, Kind.BROADCAST, what, [tensor], root=root_rank, name=name)
    return ctx, where


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return a new tensor holding job rank `root_rank`'s `tensor`; `tensor` is not modified.
    Shapes and dtypes must match on all ranks. Differentiable."""
    _, where = _broadcast_scope("hvd.broadcast", tensor, root_rank, name, process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFunction.apply(tensor, root_rank, where, process_set)
    return complete(_start_broadcast(where, tensor, root_rank, False))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `broadcast`; `synchronize(handle)` returns the new tensor."""
    return started(
        current("hvd.broadcast_async"), process_set, Kind.BROADCAST, "hvd.broadcast_async",
        [tensor], lambda where, _: _start_broadcast(where, tensor, root_rank, False),
        root=root_rank, name=name,
    )  # fmt: skip


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Overwrite `tensor` with `root_rank`'s value and return it (its contents are
    unspecified if the call fails)."""
    _, where = _broadcast_scope("hvd.broadcast_", tensor, root_rank, name, process_set)
    return complete(_start_broadcast(where, tensor, root_rank, True))


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `broadcast_`; `synchronize(handle)` returns `tensor`, overwritten in place."""
    return started(
        current("hvd.broadcast_async_"), process_set, Kind.BROADCAST, "hvd.broadcast_async_",
        [tensor], lambda where, _: _start_broadcast(where, tensor, root_rank, True),
        root=root_rank, name=name,
    )  # fmt: skip
