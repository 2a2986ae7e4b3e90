"""Horovod's alltoall over `torch.distributed`: each rank sends rows of its tensor to every
rank and receives theirs.

Any dtype moves (`wire_dtypes.as_bytes`). A direct call first agrees with the other ranks on
its arguments (`negotiation.py`); a mismatch (dtype, shape beyond dimension 0, name), or
splits of one rank that cannot work, raise the same `CollectiveArgumentError` on every rank.
A lost peer or a broken round raises `WorkerLostError`.

Gradient (Horovod's definition): gradients travel back along the received splits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.checks import Kind, Problem, dtype_code
from elastic.worker.collectives.handles import Handle, Pending, complete, wait
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set
from elastic.worker.collectives.wire_dtypes import as_bytes
from elastic.worker.context import current

__all__ = ["alltoall", "alltoall_async"]


def _alltoall_sends(
    tensor: torch.Tensor, splits: torch.Tensor | Iterable[int] | None, size: int
) -> tuple[list[int], Problem, int]:
    """The rows this rank sends to each rank, as Horovod reads `splits`; or a `Problem` (and
    its detail) with these arguments. Splits must be integers, one per rank, not negative,
    summing to at most dimension 0 (rows after their sum are not sent); none, or an empty
    list, divides dimension 0 equally."""
    if tensor.dim() == 0:
        return [], Problem.SCALAR, 0
    rows = tensor.shape[0]
    values: list[int] = []
    if isinstance(splits, torch.Tensor):
        if splits.dim() > 1:
            return [], Problem.SPLITS_SHAPE, 0
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            return [], Problem.SPLITS_TYPE, dtype_code(splits.dtype)
        values = [int(v) for v in splits.tolist()]
    elif splits is not None:
        try:
            values = [int(v) for v in splits]
        except (TypeError, ValueError):
            return [], Problem.SPLITS_TYPE, -1
    if values:
        if len(values) != size:
            return [], Problem.SPLITS_LENGTH, len(values)
        if min(values) < 0:
            return [], Problem.SPLITS_NEGATIVE, 0
        if sum(values) > rows:
            return [], Problem.SPLITS_SUM, sum(values)
        return values, Problem.NONE, 0
    if rows % size:
        return [], Problem.NOT_DIVISIBLE, 0
    return [rows // size] * size, Problem.NONE, 0


def _start_alltoall(
    where: Scope, tensor: torch.Tensor, send: list[int], split_dtype: torch.dtype
) -> Pending:
    """Send `send[r]` rows to rank r. The counts are exchanged before this returns; the data
    asynchronously. The pending result is `(output, received_splits)`."""
    meta = torch.tensor(send, dtype=torch.int64)
    peer_meta = torch.empty_like(meta)
    wait(dist.all_to_all_single(peer_meta, meta, group=where.group, async_op=True))
    recv = peer_meta.tolist()
    received_splits = torch.tensor(recv, dtype=split_dtype)
    source, restore = as_bytes(tensor.narrow(0, 0, sum(send)))
    out = source.new_empty((sum(recv), *source.shape[1:]))
    works = []
    if source.shape[1:].numel() > 0:
        works.append(
            dist.all_to_all_single(
                out,
                source,
                output_split_sizes=recv,
                input_split_sizes=send,
                group=where.group,
                async_op=True,
            )
        )
    return works, lambda: (restore(out), received_splits)


class _AlltoallFunction(torch.autograd.Function):
    """Differentiable alltoall: gradients travel back along the received splits."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, send: list[int], dtype, where: Scope):
        out, received = complete(_start_alltoall(where, tensor, send, dtype))
        fctx.received, fctx.where, fctx.rows = received, where, tensor.shape[0]
        fctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor, _unused: Any):
        send = fctx.received.tolist()
        back, _ = complete(_start_alltoall(fctx.where, grad.contiguous(), send, torch.int64))
        if back.shape[0] < fctx.rows:  # rows after the splits' sum were not sent
            back = torch.cat([back, back.new_zeros((fctx.rows - back.shape[0], *back.shape[1:]))])
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send rows of `tensor` to every rank of `process_set` and receive theirs, as Horovod 0.28.

    Every member passes a tensor of the same dtype and shape beyond dimension 0.

    Args:
        tensor: the rows this rank sends; not modified.
        splits: `splits[i]` rows (in order, along dimension 0) go to rank i: integers, one per
            rank, not negative, summing to at most dimension 0 (later rows are not sent);
            without them dimension 0 is divided equally and must be a multiple of the number of
            ranks.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        The received rows in rank order, differentiable (gradients travel back along the
        received splits); with `splits` given, the pair `(rows, received_splits)`: the rows from
        each rank, in `splits`' dtype if it is a tensor, else int32.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError (a `ValueError`, as Horovod's): the ranks' arguments do not
            agree, or one rank's splits cannot work (raised on every rank, with the same
            message, before any data moves), or `name` is held by a call still in flight on this
            rank (raised on this rank alone).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.alltoall")
    send, problem, detail = _alltoall_sends(tensor, splits, _size(process_set))
    dtype = _received_dtype(splits)
    where, _ = checked(
        ctx, process_set, Kind.ALLTOALL, "hvd.alltoall", [tensor],
        name=name, problem=problem, detail=detail,
    )  # fmt: skip
    if tensor.requires_grad and torch.is_grad_enabled():
        out, received = _AlltoallFunction.apply(tensor, send, dtype, where)
    else:
        out, received = complete(_start_alltoall(where, tensor, send, dtype))
    return out if splits is None else (out, received)


def _size(process_set: ProcessSet) -> int:
    return len(process_set.ranks)


def _received_dtype(splits: Any) -> torch.dtype:
    """Horovod's: the splits' dtype when they are a tensor, else int32."""
    return splits.dtype if isinstance(splits, torch.Tensor) else torch.int32


def alltoall_async(
    tensor: torch.Tensor,
    splits: torch.Tensor | Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `alltoall` and return at once (the splits are exchanged before it returns).

    Args:
        As `alltoall`.

    Returns:
        A `Handle`: `synchronize(handle)` returns `(rows, received_splits)` whether or not
        splits were given, as Horovod's.

    Raises:
        CollectiveArgumentError, NotInitializedError: as `alltoall`, from this call.
        WorkerLostError, RuntimeError: as `alltoall`, from this call (the ranks agree on it
            before it starts) or from `synchronize(handle)` (while the data moves).
    """
    ctx = current("hvd.alltoall_async")
    send, problem, detail = _alltoall_sends(tensor, splits, _size(process_set))
    dtype = _received_dtype(splits)
    return started(
        ctx, process_set, Kind.ALLTOALL, "hvd.alltoall_async", [tensor],
        lambda where, _: _start_alltoall(where, tensor, send, dtype),
        name=name, problem=problem, detail=detail,
    )  # fmt: skip
