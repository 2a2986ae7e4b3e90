"""Horovod's reducescatter and grouped reducescatter over `torch.distributed`: reduce over the
ranks, and keep this rank's rows.

Dimension 0 is split as Horovod splits it: the first `rows % size` ranks get one row more.
Only Average and Sum, as Horovod. A direct call first agrees with the other ranks on its
arguments (`negotiation.py`); a mismatch, or a tensor without dimensions, raises the same
`CollectiveArgumentError` on every rank. A lost peer or a broken round raises
`WorkerLostError`.

Gradients (Horovod's definition): the allgathered gradient times the forward's factors, and
times the number of ranks for Sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.checks import Kind, scalar_problem
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
from elastic.worker.collectives.row_gather import gather_rows
from elastic.worker.collectives.wire_dtypes import wire_dtype
from elastic.worker.context import current

__all__ = [
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "reducescatter",
    "reducescatter_async",
]


def _split_rows(rows: int, size: int) -> list[int]:
    """Horovod's split of dimension 0: the first `rows % size` ranks get one row more."""
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]


def _start_reducescatter(
    where: Scope,
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    prescale: float,
    postscale: float,
) -> Pending:
    """Launch one reducescatter per tensor; the pending result is this rank's slices.

    CPU tensors (Gloo) go as an `all_to_all_single` of the row slices, summed here: Gloo's
    reduce-scatter ignores its wait's timeout, so a rank blocked in it on a live peer that
    went on to the next round could not see its round broken (the same as FSDP2's, see
    `elastic.state.sharded.fsdp_comms`)."""
    works: list[dist.Work] = []
    outputs: list[tuple[torch.Tensor, torch.dtype, torch.Tensor | None]] = []
    for tensor in tensors:
        wire = wire_dtype(tensor.dtype)
        work = tensor.to(wire, memory_format=torch.contiguous_format, copy=True)
        scale_(work, prescale)
        split = _split_rows(work.shape[0], where.size)
        out = work.new_empty((split[where.rank], *work.shape[1:]))
        received = None
        if work.numel() > 0 and work.device.type == "cpu":
            received = work.new_empty((where.size * split[where.rank], *work.shape[1:]))
            mine = [split[where.rank]] * where.size
            works.append(
                dist.all_to_all_single(
                    received, work, mine, split, group=where.group, async_op=True
                )
            )
        elif work.numel() > 0:
            pieces = list(work.split(split))
            works.append(
                dist.reduce_scatter(out, pieces, op=torch_op(op), group=where.group, async_op=True)
            )
        outputs.append((out, tensor.dtype, received))

    def finish() -> list[torch.Tensor]:
        results = []
        for out, dtype, received in outputs:
            if received is not None:  # every rank's slice of this rank's rows: their sum
                torch.sum(received.view(where.size, *out.shape), dim=0, out=out)
            finish_(out, op, postscale, where.size)
            results.append(out if out.dtype == dtype else out.to(dtype))
        return results

    return works, finish


def _reducescatter_op(op: int | None) -> ReduceOp:
    resolved = resolve_op(op, None)
    if resolved not in (Average, Sum):
        raise NotImplementedError("reducescatter supports only Average and Sum, as Horovod")
    return resolved


class _ReducescatterFunction(torch.autograd.Function):
    """Differentiable reducescatter, as Horovod defines its gradient: the allgathered
    gradient times the forward's factors, and times the number of ranks for Sum."""

    @staticmethod
    def forward(fctx: Any, op, pre, post, where: Scope, ps: ProcessSet, *tensors: torch.Tensor):
        fctx.op, fctx.pre, fctx.post, fctx.ps = op, pre, post, ps
        fctx.rows = [t.shape[0] for t in tensors]
        return tuple(complete(_start_reducescatter(where, tensors, op, pre, post)))

    @staticmethod
    def backward(fctx: Any, *grads: torch.Tensor):
        ctx = current("hvd.reducescatter (backward)")
        where = scope(ctx, fctx.ps, "hvd.reducescatter (backward)")
        factor = fctx.pre * fctx.post * (where.size if fctx.op == Sum else 1)
        gathered = []
        for grad, rows in zip(grads, fctx.rows, strict=True):
            full = gather_rows(where, grad.contiguous(), _split_rows(rows, where.size))
            scale_(full, factor)
            gathered.append(full)
        return (None, None, None, None, None, *gathered)


def _reducescatter(
    what: str,
    tensors: Sequence[torch.Tensor],
    name: str | None,
    compression: type[Compressor],
    op: int | None,
    process_set: ProcessSet,
    prescale: float,
    postscale: float,
    grouped: bool,
) -> list[torch.Tensor]:
    ctx = current(what)
    resolved = _reducescatter_op(op)
    kind = Kind.GROUPED_REDUCESCATTER if grouped else Kind.REDUCESCATTER
    problem = scalar_problem(tensors)
    where, _ = checked(
        ctx, process_set, kind, what, tensors, op=resolved, name=name, problem=problem
    )
    compressed = [compression.compress(t) for t in tensors]
    inputs = [c for c, _ in compressed]
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        outs = _ReducescatterFunction.apply(
            resolved, prescale, postscale, where, process_set, *inputs
        )
    else:
        outs = complete(_start_reducescatter(where, inputs, resolved, prescale, postscale))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, compressed, strict=True)]


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce `tensor` over the ranks of `process_set` and return this rank's rows of the
    result.

    Dimension 0 is split as Horovod splits it: the first `rows % size` ranks get one row more.
    Every member passes a tensor of the same dtype and shape.

    Args:
        tensor: what this rank contributes, with at least one dimension; not modified.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        compression: how the tensor travels (`Compression.none`, `Compression.fp16`).
        op: `Average` (default) or `Sum`.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after it.

    Returns:
        A new tensor, this rank's rows of `postscale_factor * op(prescale_factor * tensor)`;
        differentiable (its gradient is the allgathered gradient times the same factors, and
        times the number of ranks for Sum).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        NotImplementedError: an op other than Average and Sum.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    return _reducescatter(
        "hvd.reducescatter", [tensor], name, compression, op, process_set,
        prescale_factor, postscale_factor, grouped=False,
    )[0]  # fmt: skip


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """`reducescatter` of each tensor of `tensors`.

    Args:
        tensors: what this rank contributes; not modified.
        Others: as `reducescatter`.

    Returns:
        A list of new tensors, this rank's rows of each result; differentiable.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        NotImplementedError: an op other than Average and Sum.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    return _reducescatter(
        "hvd.grouped_reducescatter", list(tensors), name, compression, op, process_set,
        prescale_factor, postscale_factor, grouped=True,
    )  # fmt: skip


def _reducescatter_async(
    what: str,
    tensors: Sequence[torch.Tensor],
    name: str | None,
    op: int | None,
    process_set: ProcessSet,
    prescale: float,
    postscale: float,
    grouped: bool,
) -> Handle:
    ctx = current(what)
    resolved = _reducescatter_op(op)
    kind = Kind.GROUPED_REDUCESCATTER if grouped else Kind.REDUCESCATTER

    def start(where: Scope, _rows: object) -> Pending:
        works, finish = _start_reducescatter(where, tensors, resolved, prescale, postscale)
        return works, finish if grouped else (lambda: finish()[0])

    return started(
        ctx, process_set, kind, what, tensors, start,
        op=resolved, name=name, problem=scalar_problem(tensors),
    )  # fmt: skip


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int | None = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start `reducescatter` and return at once.

    Args:
        As `reducescatter` (without `compression`).

    Returns:
        A `Handle`: `synchronize(handle)` returns this rank's rows.

    Raises:
        CollectiveArgumentError, NotImplementedError, NotInitializedError: as `reducescatter`,
            from this call.
        WorkerLostError, RuntimeError: as `reducescatter`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    return _reducescatter_async(
        "hvd.reducescatter_async", [tensor], name, op, process_set,
        prescale_factor, postscale_factor, grouped=False,
    )  # fmt: skip


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int | None = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start `grouped_reducescatter` and return at once.

    Args:
        As `grouped_reducescatter` (without `compression`).

    Returns:
        A `Handle`: `synchronize(handle)` returns the list of this rank's rows.

    Raises:
        CollectiveArgumentError, NotImplementedError, NotInitializedError: as `reducescatter`,
            from this call.
        WorkerLostError, RuntimeError: as `reducescatter`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    return _reducescatter_async(
        "hvd.grouped_reducescatter_async", list(tensors), name, op, process_set,
        prescale_factor, postscale_factor, grouped=True,
    )  # fmt: skip
