"""Horovod's allreduce and grouped allreduce over `torch.distributed`, in place or not,
blocking or asynchronous.

Semantics are Horovod's: `op` is Average (default), Sum, Min, Max or Product; the result is
`postscale * op(prescale * tensor)`; Average sums first and divides after (floor division
for integers). Every dtype Horovod supports works; those a backend cannot reduce are reduced
in a wider type and cast back (`wire_dtypes.py`). A grouped allreduce fuses its tensors into
one buffer per (device, dtype).

Checks: a direct call first agrees with the other ranks on its arguments (`negotiation.py`);
a mismatch raises `CollectiveArgumentError` on every rank. Failures: a lost peer or a broken
round raises `WorkerLostError`; an in-place call that fails leaves its tensor unspecified.

Gradients (Horovod's definitions): allreduce and grouped allreduce reduce the gradient with
the same op and factors (Average and Sum only).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
]


def _start_allreduce(
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
        return complete(_start_allreduce(where, tensor, False, op, pre, post, Compression.none))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        _differentiable(fctx.op, "allreduce")
        ctx = current("hvd.allreduce (backward)")
        where = scope(ctx, fctx.ps, "hvd.allreduce (backward)")
        pending = _start_allreduce(
            where, grad.contiguous(), False, fctx.op, fctx.pre, fctx.post, Compression.none
        )
        return complete(pending), None, None, None, None, None


def _differentiable(op: ReduceOp, what: str) -> None:
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
            lambda where, _: _start_allreduce(
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
        _start_allreduce(
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
    """Reduce `tensor` over the ranks (of `process_set`) into a new tensor; `tensor` is not
    modified. Differentiable for Average and Sum."""
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
    """Start `allreduce`; `synchronize(handle)` returns the new reduced tensor."""
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
    """Reduce `tensor` in place over the ranks and return it."""
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
    """Start `allreduce_`; `synchronize(handle)` returns `tensor`, reduced in place."""
    return _allreduce(
        "hvd.allreduce_async_", tensor, True, True, average, name, op, prescale_factor,
        postscale_factor, process_set,
    )  # fmt: skip


# --- grouped allreduce ----------------------------------------------------------------------


def _start_grouped_allreduce(
    where: Scope,
    tensors: Sequence[torch.Tensor],
    inplace: bool,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    compression: type[Compressor],
) -> Pending:
    """One fused allreduce per (device, dtype) among `tensors`, in order of first appearance;
    the pending result is the list of reduced tensors (`tensors` themselves when `inplace`)."""
    tensors = list(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    parts = []
    works: list[dist.Work] = []
    for indices in groups.values():
        members = [tensors[i] for i in indices]
        flat = torch.cat([t.reshape(-1) for t in members])
        part_works, finish = _start_allreduce(
            where, flat, True, op, prescale, postscale, compression
        )
        works.extend(part_works)
        parts.append((indices, members, finish))

    def finish_all() -> list[torch.Tensor]:
        outputs: list[torch.Tensor] = list(tensors)
        for indices, members, finish in parts:
            flat = finish()
            pieces = flat.split([t.numel() for t in members])
            for i, t, piece in zip(indices, members, pieces, strict=True):
                if inplace:
                    t.copy_(piece.view(t.shape))
                else:
                    outputs[i] = piece.view(t.shape)
        return outputs

    return works, finish_all


class _GroupedAllreduceFunction(torch.autograd.Function):
    """Differentiable grouped allreduce: each gradient is reduced as `allreduce`'s is."""

    @staticmethod
    def forward(fctx: Any, op, pre, post, where: Scope, ps: ProcessSet, *tensors: torch.Tensor):
        fctx.op, fctx.pre, fctx.post, fctx.ps = op, pre, post, ps
        pending = _start_grouped_allreduce(where, tensors, False, op, pre, post, Compression.none)
        return tuple(complete(pending))

    @staticmethod
    def backward(fctx: Any, *grads: torch.Tensor):
        _differentiable(fctx.op, "grouped_allreduce")
        ctx = current("hvd.grouped_allreduce (backward)")
        where = scope(ctx, fctx.ps, "hvd.grouped_allreduce (backward)")
        pending = _start_grouped_allreduce(
            where, [g.contiguous() for g in grads], False, fctx.op, fctx.pre, fctx.post,
            Compression.none,
        )  # fmt: skip
        return (None, None, None, None, None, *complete(pending))


def _grouped_allreduce(
    what: str,
    tensors: Sequence[torch.Tensor],
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
    """Every grouped allreduce variant, as `_allreduce` for a list of tensors."""
    ctx = current(what)
    resolved = resolve_op(op, average)
    kind = Kind.GROUPED_ALLREDUCE
    if asynchronous:
        return started(
            ctx, process_set, kind, what, tensors,
            lambda where, _: _start_grouped_allreduce(
                where, tensors, inplace, resolved, prescale, postscale, compression
            ),
            op=resolved, name=name,
        )  # fmt: skip
    where, _ = checked(ctx, process_set, kind, what, tensors, op=resolved, name=name)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if not inplace and needs_grad:
        compressed = [compression.compress(t) for t in tensors]
        reduced = _GroupedAllreduceFunction.apply(
            resolved, prescale, postscale, where, process_set, *(c for c, _ in compressed)
        )
        return [compression.decompress(r, c) for r, (_, c) in zip(reduced, compressed, strict=True)]
    pending = _start_grouped_allreduce(
        where, tensors, inplace, resolved, prescale, postscale, compression
    )
    return complete(pending)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list of tensors (fused into one buffer per dtype and device) into new
    tensors, each as `allreduce` would. Differentiable for Average and Sum."""
    return _grouped_allreduce(
        "hvd.grouped_allreduce", tensors, False, False, average, name, op, prescale_factor,
        postscale_factor, process_set, compression,
    )  # fmt: skip


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    compression: type[Compressor] = Compression.none,
) -> Handle:
    """Start `grouped_allreduce`; `synchronize(handle)` returns the list of new tensors."""
    return _grouped_allreduce(
        "hvd.grouped_allreduce_async", tensors, False, True, average, name, op,
        prescale_factor, postscale_factor, process_set, compression,
    )  # fmt: skip


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list of tensors in place and return it."""
    return _grouped_allreduce(
        "hvd.grouped_allreduce_", tensors, True, False, average, name, op, prescale_factor,
        postscale_factor, process_set,
    )  # fmt: skip


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `grouped_allreduce_`; `synchronize(handle)` returns the list, reduced in place."""
    return _grouped_allreduce(
        "hvd.grouped_allreduce_async_", tensors, True, True, average, name, op,
        prescale_factor, postscale_factor, process_set,
    )  # fmt: skip
