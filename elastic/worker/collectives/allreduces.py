"""Horovod's allreduce over `torch.distributed`, in place or not, blocking or asynchronous.

Semantics are Horovod's: `op` is Average (default), Sum, Min, Max or Product; the result is
`postscale * op(prescale * tensor)`; Average sums first and divides after (floor division
for integers). Every dtype Horovod supports works; those a backend cannot reduce are reduced
in a wider type and cast back (`wire_dtypes.py`).

Checks: a direct call first agrees with the other ranks on its arguments (`negotiation.py`);
a mismatch raises `CollectiveArgumentError` on every rank. Failures: a lost peer or a broken
round raises `WorkerLostError`; an in-place call that fails leaves its tensor unspecified.

Gradient (Horovod's definition): the gradient is allreduced with the same op and factors
(Average and Sum only).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.checks import Kind
from elastic.worker.collectives.compression import Compression, Compressor
from elastic.worker.collectives.handles import Handle, Pending, complete
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set, scope
from elastic.worker.collectives.reduce_ops import (
    Average,
    ReduceOp,
    Sum,
    finish_,
    resolve_op,
    scale_,
    torch_op,
)
from elastic.worker.collectives.wire_dtypes import wire_dtype
from elastic.worker.context import current

__all__ = [
    "differentiable",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "start_allreduce",
]


def start_allreduce(
    where: Scope,
    tensor: torch.Tensor,
    inplace: bool,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    compression: type[Compressor],
    compressed: tuple[torch.Tensor, Any] | None = None,
) -> Pending:
    """Launch the reduction of `tensor` (already `compressed` by `compression`, if given);
    the pending result is the reduced tensor (`tensor` itself when `inplace`)."""
    buf, cctx = compressed if compressed is not None else compression.compress(tensor)
    wire = wire_dtype(buf.dtype)
    if wire != buf.dtype:
        work = buf.to(wire, memory_format=torch.contiguous_format)
    elif not buf.is_contiguous() or (not inplace and buf.data_ptr() == tensor.data_ptr()):
        work = buf.clone(memory_format=torch.contiguous_format)
    else:
        work = buf
    scale_(work, prescale)
    works = []
    if work.numel() > 0:
        works.append(dist.all_reduce(work, op=torch_op(op), group=where.group, async_op=True))

    def finish() -> torch.Tensor:
        finish_(work, op, postscale, where.size)
        reduced = work if work.dtype == buf.dtype else work.to(buf.dtype)
        out = compression.decompress(reduced, cctx)
        if inplace:
            if out is not tensor:
                tensor.copy_(out)
            return tensor
        return out

    return works, finish


class _AllreduceFunction(torch.autograd.Function):
    """Differentiable allreduce: the gradient is allreduced with the same op and factors."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, op, pre, post, where: Scope, ps: ProcessSet):
        fctx.op, fctx.pre, fctx.post, fctx.ps = op, pre, post, ps
        return complete(start_allreduce(where, tensor, False, op, pre, post, Compression.none))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        differentiable(fctx.op, "allreduce")
        ctx = current("hvd.allreduce (backward)")
        where = scope(ctx, fctx.ps, "hvd.allreduce (backward)")
        pending = start_allreduce(
            where, grad.contiguous(), False, fctx.op, fctx.pre, fctx.post, Compression.none
        )
        return complete(pending), None, None, None, None, None


def differentiable(op: ReduceOp, what: str) -> None:
    if op not in (Average, Sum):
        raise NotImplementedError(f"{what} is differentiable only for Average and Sum")


def _allreduce(
    what: str,
    tensor: torch.Tensor,
    inplace: bool,
    asynchronous: bool,
    average: bool | None,
    name: str | None,
    op: int | None,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    compression: type[Compressor] = Compression.none,
) -> Any:
    """Every allreduce variant: checked, then reduced (through autograd where the input
    needs a gradient and the call returns a new tensor); a `Handle` if `asynchronous`."""
    ctx = current(what)
    resolved = resolve_op(op, average)
    compressed = compression.compress(tensor)
    kind = Kind.ALLREDUCE
    if asynchronous:
        return started(
            ctx, process_set, kind, what, [compressed[0]],
            lambda where, _: start_allreduce(
                where, tensor, inplace, resolved, prescale, postscale, compression, compressed
            ),
            op=resolved, name=name,
        )  # fmt: skip
    where, _ = checked(ctx, process_set, kind, what, [compressed[0]], op=resolved, name=name)
    if not inplace and tensor.requires_grad and torch.is_grad_enabled():
        reduced = _AllreduceFunction.apply(
            compressed[0], resolved, prescale, postscale, where, process_set
        )
        return compression.decompress(reduced, compressed[1])
    return complete(
        start_allreduce(
            where, tensor, inplace, resolved, prescale, postscale, compression, compressed
        )
    )


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` over the ranks of `process_set` into a new tensor.

    Every member of the call passes a tensor of the same dtype and shape, and the same op and
    name. The result is `postscale_factor * op(prescale_factor * tensor)`; Average divides the
    sum by the number of ranks (floor division for integers).

    Args:
        tensor: what this rank contributes; not modified.
        average: deprecated: True is `op=Average`, False `op=Sum`; give `op` instead.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        op: `Average` (default), `Sum`, `Min`, `Max` or `Product`.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after it.
        compression: how the tensor travels (`Compression.none`, `Compression.fp16`).
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        A new tensor, the result; differentiable for Average and Sum (its gradient is allreduced
        the same way).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        ValueError: both `op` and `average` given.
        NotImplementedError: `op=Adasum`.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    return _allreduce(
        "hvd.allreduce", tensor, False, False, average, name, op, prescale_factor,
        postscale_factor, process_set, compression,
    )  # fmt: skip


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    compression: type[Compressor] = Compression.none,
) -> Handle:
    """Start `allreduce` and return at once.

    Args:
        As `allreduce`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the new reduced tensor; `poll(handle)` says
        whether it is done.

    Raises:
        CollectiveArgumentError, ValueError, NotImplementedError, NotInitializedError: as
            `allreduce`, from this call.
        WorkerLostError, RuntimeError: as `allreduce`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    return _allreduce(
        "hvd.allreduce_async", tensor, False, True, average, name, op, prescale_factor,
        postscale_factor, process_set, compression,
    )  # fmt: skip


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` in place over the ranks of `process_set`, as `allreduce` does.

    Args:
        tensor: what this rank contributes; overwritten with the result.
        Others: as `allreduce`.

    Returns:
        `tensor`, holding the result.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        ValueError: both `op` and `average` given.
        NotImplementedError: `op=Adasum`.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.

    After an error the tensor's contents are unspecified.
    """
    return _allreduce(
        "hvd.allreduce_", tensor, True, False, average, name, op, prescale_factor,
        postscale_factor, process_set,
    )  # fmt: skip


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `allreduce_` and return at once.

    Args:
        As `allreduce_`.

    Returns:
        A `Handle`: `synchronize(handle)` returns `tensor`, reduced in place.

    Raises:
        CollectiveArgumentError, ValueError, NotImplementedError, NotInitializedError: as
            `allreduce`, from this call.
        WorkerLostError, RuntimeError: as `allreduce`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).

    After an error the tensor's contents are unspecified.
    """
    return _allreduce(
        "hvd.allreduce_async_", tensor, True, True, average, name, op, prescale_factor,
        postscale_factor, process_set,
    )  # fmt: skip
