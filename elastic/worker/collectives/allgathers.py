"""Horovod's data-moving collectives: allgather (grouped too), broadcast, alltoall, objects,
and the barrier, over `torch.distributed`.

Any dtype moves: those a backend lacks travel as their bytes (`reduce_ops.as_bytes`). A
direct call first agrees with the other ranks on its arguments (`negotiation.py`); a
mismatch (dtype, shape beyond dimension 0 for allgather and alltoall, root rank, name), or
arguments of one rank that cannot work (a tensor without dimensions, alltoall splits that
do not fit), raises the same `CollectiveArgumentError` on every rank. A lost peer or a
broken round raises `WorkerLostError`.

Gradients (Horovod's definitions): allgather averages the gradient over the ranks and takes
this rank's rows; broadcast gives the root the averaged gradient and other ranks zeros;
alltoall sends gradients back along the received splits.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.checks import DIM0, Kind, Problem, check_root, dtype_code
from elastic.worker.collectives.handles import Handle, Pending, complete, wait
from elastic.worker.collectives.negotiation import checked, started
from elastic.worker.collectives.process_sets import ProcessSet, Scope, global_process_set
from elastic.worker.collectives.reduce_ops import Average, as_bytes
from elastic.worker.context import current
from elastic.worker.torch_versions import all_gather_single

__all__ = [
    "allgather",
    "allgather_async",
    "allgather_object",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "gather_rows",
    "grouped_allgather",
    "grouped_allgather_async",
]


def _gather_ints(where: Scope, values: list[int]) -> list[list[int]]:
    """Blocking allgather of a few integers per rank; rows in the scope's order."""
    mine = torch.tensor(values, dtype=torch.int64)
    out = torch.empty(where.size * len(values), dtype=torch.int64)
    wait(all_gather_single(out, mine, group=where.group, async_op=True))
    return out.view(where.size, len(values)).tolist()


def _start_gather(where: Scope, tensor: torch.Tensor, dims: list[int]) -> Pending:
    """Launch the allgather of `tensor` whose first dimension on each rank is `dims[r]`; the
    pending result is the concatenation in rank order."""
    source, restore = as_bytes(tensor)
    longest = max(dims)
    rest = source.shape[1:]
    if longest * rest.numel() == 0:
        return [], lambda: restore(source.new_empty((sum(dims), *rest)))
    even = all(d == longest for d in dims)
    if even:
        send = source
    else:
        send = source.new_empty((longest, *rest))
        send[: source.shape[0]].copy_(source)
    out = source.new_empty((where.size * longest, *rest))
    works = [all_gather_single(out, send, group=where.group, async_op=True)]

    def finish() -> torch.Tensor:
        if even:
            return restore(out)
        return restore(torch.cat([out[r * longest : r * longest + d] for r, d in enumerate(dims)]))

    return works, finish


def gather_rows(where: Scope, tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """Allgather `tensor` (first dimension `dims[r]` on rank r) without checks: for the
    gradients of other collectives, whose shapes the ranks already agreed on."""
    return complete(_start_gather(where, tensor, dims))


def _dims(where: Scope, tensors: Sequence[torch.Tensor], rows: list[list[int]] | None):
    """Every rank's first dimensions of `tensors`: from the check's rows when it ran and
    there is one tensor, else exchanged."""
    if rows is not None and len(tensors) == 1:
        return [[row[DIM0]] for row in rows]
    return _gather_ints(where, [t.shape[0] for t in tensors])


class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged over ranks, then this rank's rows."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, where: Scope, dims: list[int], ps):
        fctx.dims, fctx.index, fctx.ps = dims, where.rank, ps
        return complete(_start_gather(where, tensor, dims))

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

    Dimension 0 may differ between ranks; other dimensions and the dtype must match.
    Differentiable."""
    ctx = current("hvd.allgather")
    what = "hvd.allgather"
    where, rows = checked(
        ctx, process_set, Kind.ALLGATHER, what, [tensor], name=name, problem=_scalar([tensor])
    )
    dims = [row[0] for row in _dims(where, [tensor], rows)]
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFunction.apply(tensor, where, dims, process_set)
    return complete(_start_gather(where, tensor, dims))


def allgather_async(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `allgather` (the sizes are exchanged before it returns); `synchronize(handle)`
    returns the concatenated tensor."""
    ctx = current("hvd.allgather_async")

    def start(where: Scope, rows: list[list[int]] | None) -> Pending:
        return _start_gather(where, tensor, [row[0] for row in _dims(where, [tensor], rows)])

    return started(
        ctx, process_set, Kind.ALLGATHER, "hvd.allgather_async", [tensor], start,
        name=name, problem=_scalar([tensor]),
    )  # fmt: skip


def _scalar(tensors: Sequence[torch.Tensor]) -> Problem:
    """SCALAR where a tensor has no dimension 0 to gather or split."""
    return Problem.SCALAR if any(t.dim() == 0 for t in tensors) else Problem.NONE


def _start_grouped_gather(where: Scope, tensors: Sequence[torch.Tensor], rows) -> Pending:
    table = _dims(where, tensors, rows)
    parts = [_start_gather(where, t, [r[i] for r in table]) for i, t in enumerate(tensors)]
    works = [w for part_works, _ in parts for w in part_works]
    return works, lambda: [finish() for _, finish in parts]


class _GroupedAllgatherFunction(torch.autograd.Function):
    """Differentiable grouped allgather: each gradient as `allgather`'s."""

    @staticmethod
    def forward(fctx: Any, where: Scope, ps, *tensors: torch.Tensor):
        table = _dims(where, tensors, None)
        fctx.table, fctx.index, fctx.ps = table, where.rank, ps
        parts = [_start_gather(where, t, [r[i] for r in table]) for i, t in enumerate(tensors)]
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
    """`allgather` of each tensor of a list; differentiable."""
    ctx = current("hvd.grouped_allgather")
    what = "hvd.grouped_allgather"
    kind = Kind.GROUPED_ALLGATHER
    where, rows = checked(
        ctx, process_set, kind, what, tensors, name=name, problem=_scalar(tensors)
    )
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_GroupedAllgatherFunction.apply(where, process_set, *tensors))
    return complete(_start_grouped_gather(where, tensors, rows))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start `grouped_allgather`; `synchronize(handle)` returns the list of results."""
    ctx = current("hvd.grouped_allgather_async")
    return started(
        ctx, process_set, Kind.GROUPED_ALLGATHER, "hvd.grouped_allgather_async", tensors,
        lambda where, rows: _start_grouped_gather(where, tensors, rows),
        name=name, problem=_scalar(tensors),
    )  # fmt: skip


# --- broadcast ------------------------------------------------------------------------------


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


# --- alltoall -------------------------------------------------------------------------------


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
    """Send rows of `tensor` to every rank and receive theirs, as Horovod 0.28.

    `splits[i]` rows (in order, along dimension 0) go to rank i: integers, one per rank,
    summing to at most dimension 0 (later rows are not sent); without splits dimension 0 is
    divided equally (it must be a multiple of the number of ranks). Returns the received
    rows in rank order, and, only when `splits` is given, also `received_splits` (rows from
    each rank; `splits`' dtype if it is a tensor, else int32). Differentiable. Splits that
    cannot work on any rank raise the same `CollectiveArgumentError` (a `ValueError`, as
    Horovod's) on every rank.
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
    """Start `alltoall` (splits are exchanged before it returns); `synchronize(handle)`
    returns `(output, received_splits)` whether or not splits were given, as Horovod."""
    ctx = current("hvd.alltoall_async")
    send, problem, detail = _alltoall_sends(tensor, splits, _size(process_set))
    dtype = _received_dtype(splits)
    return started(
        ctx, process_set, Kind.ALLTOALL, "hvd.alltoall_async", [tensor],
        lambda where, _: _start_alltoall(where, tensor, send, dtype),
        name=name, problem=problem, detail=detail,
    )  # fmt: skip


# --- objects and barrier --------------------------------------------------------------------


def _pickled(obj: Any) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
    )


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Return `root_rank`'s `obj` on every rank (the root gets its own object back).

    Uses pickle, which is safe here only because peers are the job's own authenticated
    workers. Tensors inside keep their device."""
    ctx = current("hvd.broadcast_object")
    what = "hvd.broadcast_object"
    length = torch.zeros(1, dtype=torch.int64)
    where, _ = checked(ctx, process_set, Kind.BROADCAST, what, [length], root=root_rank, name=name)
    check_root(root_rank, where, what)
    is_root = where.members[where.rank] == root_rank
    src = where.members.index(root_rank)
    payload = _pickled(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length[0] = payload.numel()
    wait(dist.broadcast(length, group=where.group, group_src=src, async_op=True))
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    wait(dist.broadcast(payload, group=where.group, group_src=src, async_op=True))
    if is_root:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Return every rank's `obj` as a list in rank order (pickled, like `broadcast_object`)."""
    ctx = current("hvd.allgather_object")
    payload = _pickled(obj)
    what = "hvd.allgather_object"
    where, rows = checked(ctx, process_set, Kind.ALLGATHER, what, [payload], name=name)
    dims = [row[0] for row in _dims(where, [payload], rows)]
    blob = complete(_start_gather(where, payload, dims)).numpy()
    objects, offset = [], 0
    for dim in dims:
        objects.append(pickle.loads(blob[offset : offset + dim].tobytes()))
        offset += dim
    return objects


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank (of `process_set`) has called `barrier()`."""
    ctx = current("hvd.barrier")
    where, rows = checked(ctx, process_set, Kind.BARRIER, "hvd.barrier", [])
    if rows is None:
        wait(dist.all_reduce(torch.zeros(1), group=where.group, async_op=True))
