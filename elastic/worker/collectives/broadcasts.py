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
    """Return a new tensor holding job rank `root_rank`'s `tensor`.

    Every member passes a tensor of the same dtype and shape, and the same root.

    Args:
        tensor: the root's value to send; on the others, the shape to receive; not modified.
        root_rank: the job rank whose tensor every member gets; a member of `process_set`.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        A new tensor, the root's value; differentiable (the root gets the gradient averaged over
        the ranks, the others zeros).

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
    """Start `broadcast` and return at once.

    Args:
        As `broadcast`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the new tensor.

    Raises:
        CollectiveArgumentError, NotInitializedError: as `broadcast`, from this call.
        WorkerLostError, RuntimeError: as `broadcast`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
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
    """Overwrite `tensor` with job rank `root_rank`'s value, as `broadcast` does.

    Args:
        tensor: the root's value to send; on the others, overwritten.
        Others: as `broadcast`.

    Returns:
        `tensor`, holding the root's value.

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

    After an error the tensor's contents are unspecified.
    """
    _, where = _broadcast_scope("hvd.broadcast_", tensor, root_rank, name, process_set)
    return complete(_start_broadcast(where, tensor, root_rank, True))


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `broadcast_` and return at once.

    Args:
        As `broadcast_`.

    Returns:
        A `Handle`: `synchronize(handle)` returns `tensor`, overwritten in place.

    Raises:
        CollectiveArgumentError, NotInitializedError: as `broadcast`, from this call.
        WorkerLostError, RuntimeError: as `broadcast`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).

    After an error the tensor's contents are unspecified.
    """
    return started(
        current("hvd.broadcast_async_"), process_set, Kind.BROADCAST, "hvd.broadcast_async_",
        [tensor], lambda where, _: _start_broadcast(where, tensor, root_rank, True),
        root=root_rank, name=name,
    )  # fmt: skip
