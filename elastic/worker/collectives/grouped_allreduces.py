"""Horovod's grouped allreduce over `torch.distributed`: a list of tensors reduced as
`allreduce` reduces each, fused into one buffer per (device, dtype), in place or not,
blocking or asynchronous.

Checks, failures and gradients are `allreduce`'s (`allreduces.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.allreduces import differentiable, start_allreduce
from elastic.worker.collectives.checks import Kind
from elastic.worker.collectives.compression import Compression, Compressor
from elastic.worker.collectives.handles import Handle, Pending, complete
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set, scope
from elastic.worker.collectives.reduce_ops import (
    ReduceOp,
    resolve_op,
)
from elastic.worker.context import current

__all__ = [
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
]


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
        part_works, finish = start_allreduce(
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
        differentiable(fctx.op, "grouped_allreduce")
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
    """Reduce each tensor of `tensors` over the ranks of `process_set`, as `allreduce` does,
    into new tensors.

    The tensors are fused into one buffer per (device, dtype), reduced by one call each. Every
    member passes the same list (dtypes and shapes).

    Args:
        tensors: what this rank contributes; not modified.
        Others: as `allreduce`.

    Returns:
        A list of new tensors, in the order of `tensors`; differentiable for Average and Sum.

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
    """Start `grouped_allreduce` and return at once.

    Args:
        As `grouped_allreduce`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the list of new tensors.

    Raises:
        CollectiveArgumentError, ValueError, NotImplementedError, NotInitializedError: as
            `grouped_allreduce`, from this call.
        WorkerLostError, RuntimeError: as `grouped_allreduce`, from this call (the ranks agree
            on it before it starts) or from `synchronize(handle)` (while the data moves).
    """
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
    """Reduce each tensor of `tensors` in place, as `grouped_allreduce` does.

    Args:
        tensors: what this rank contributes; each overwritten with its result.
        Others: as `allreduce`.

    Returns:
        `tensors`, as a list, holding the results.

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

    After an error the tensors' contents are unspecified.
    """
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
    """Start `grouped_allreduce_` and return at once.

    Args:
        As `grouped_allreduce_`.

    Returns:
        A `Handle`: `synchronize(handle)` returns the list, reduced in place.

    Raises:
        CollectiveArgumentError, ValueError, NotImplementedError, NotInitializedError: as
            `grouped_allreduce`, from this call.
        WorkerLostError, RuntimeError: as `grouped_allreduce`, from this call (the ranks agree
            on it before it starts) or from `synchronize(handle)` (while the data moves).

    After an error the tensors' contents are unspecified.
    """
    return _grouped_allreduce(
        "hvd.grouped_allreduce_async_", tensors, True, True, average, name, op,
        prescale_factor, postscale_factor, process_set,
    )  # fmt: skip
