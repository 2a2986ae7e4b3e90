"""Horovod-semantics collectives over `torch.distributed` (Gloo on CPU, NCCL on CUDA).

Every public call first reads the process-wide `WorkerContext` (so it raises
`NotInitializedError` before `init()`) and passes its group explicitly to torch.distributed.

Ordering: torch.distributed matches operations by the order in which ranks issue them, not by
name. Every rank must issue the same collectives, with matching shapes and dtypes, in the same
order. `name` is accepted for Horovod compatibility and otherwise ignored.

Failures: when a peer dies or the group breaks, the call (or `synchronize()` of its handle)
raises the `RuntimeError` that torch.distributed raises; the elastic runtime turns that into
`WorkerLostError`. An in-place operation that fails leaves its tensor with unspecified contents.
Mismatched arguments that the ranks can see (shapes beyond dimension 0 for allgather and
alltoall, invalid splits or root ranks) raise `ValueError` on every rank alike.
"""

from __future__ import annotations

import enum
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.compression import Compression, Compressor
from elastic.worker.context import WorkerContext, current
from elastic.worker.errors import WorkerLostError

__all__ = [
    "Adasum",
    "Average",
    "Handle",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "poll",
    "synchronize",
]


class ReduceOp(enum.IntEnum):
    """Reduction operations; the numeric values are Horovod's."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

# A launched operation: the torch.distributed works to wait for, then the post-processing
# (averaging, unpadding, decompression, copying back) that produces the result.
_Pending = tuple[list[dist.Work], Callable[[], Any]]


_WAIT_SLICE = timedelta(milliseconds=10)


def _wait(work: dist.Work) -> None:
    """Block until `work` completes: the only place the worker waits on torch.distributed.

    Waits in short slices (no latency is added: a slice returns as soon as the work is done)
    and, between slices, checks whether the driver declared this epoch broken, because a Gloo
    collective blocked on a hung peer cannot be interrupted any other way; once it has blocked
    for a while, the peers are probed (`PeerWatch`): a partition the driver does not see is
    reported to it, and it breaks the round. Raises
    `WorkerLostError` when the collective fails (a peer died or closed its connections) or
    the epoch is broken, and `RuntimeError` with torch's message when the collective timeout
    passes.
    """
    ctx = current("a collective")
    started = time.monotonic()
    deadline = started + ctx.timeout
    while True:
        try:
            work.wait(timeout=_WAIT_SLICE)
            return
        except RuntimeError as err:
            if "timed out" not in str(err).lower():
                first = str(err).splitlines()[0].split(". ")[0][:200]
                raise WorkerLostError(f"a collective of round {ctx.epoch} failed: {first}") from err
        reason = ctx.events.broken(ctx.epoch)
        if reason is not None:
            raise WorkerLostError(f"round {ctx.epoch} is broken: {reason}")
        if ctx.peers is not None and ctx.store is not None:
            ctx.peers.blocked(ctx.store, ctx.epoch, ctx.rank, ctx.size, started)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a collective did not complete within {ctx.timeout:g} s (--collective-timeout)"
            )


def _complete(pending: _Pending) -> Any:
    works, finish = pending
    for work in works:
        _wait(work)
    return finish()


class Handle:
    """An asynchronous collective in flight: pass it to `synchronize()` or `poll()`.

    It keeps the tensors of the operation alive until the operation is finished.
    """

    __slots__ = ("_works", "_finish", "_result", "_done")

    def __init__(self, pending: _Pending) -> None:
        self._works, self._finish = pending
        self._result: Any = None
        self._done = False

    def _is_completed(self) -> bool:
        return self._done or all(work.is_completed() for work in self._works)

    def _complete(self) -> Any:
        if not self._done:
            self._result = _complete((self._works, self._finish))
            self._done = True
            self._works = []
            self._finish = _no_result
        return self._result


def _no_result() -> None:
    return None


def synchronize(handle: Handle) -> Any:
    """Wait for `handle`'s operation and return its result (the same result on later calls).

    Raises `RuntimeError` if the collective failed (a peer died); the elastic runtime turns
    that into `WorkerLostError`.
    """
    current("hvd.synchronize")
    return handle._complete()


def poll(handle: Handle) -> bool:
    """True when `handle`'s operation has finished (successfully or not); never blocks."""
    current("hvd.poll")
    return handle._is_completed()


# --- reduction helpers ----------------------------------------------------------------------


def _resolve_op(op: int | None, average: bool | None) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError("pass either op or the deprecated average argument, not both")
    if op is None:
        return Average if average is None or average else Sum
    resolved = ReduceOp(op)
    if resolved == Adasum:
        raise NotImplementedError("Adasum is not supported by elasticrun: use Average or Sum")
    return resolved


def _torch_op(op: ReduceOp) -> dist.ReduceOp.RedOpType:
    if op in (Average, Sum):
        return dist.ReduceOp.SUM
    if op == Min:
        return dist.ReduceOp.MIN
    if op == Max:
        return dist.ReduceOp.MAX
    return dist.ReduceOp.PRODUCT


def _scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place; integer tensors are scaled in float64 and truncated, as Horovod."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(tensor.double().mul_(factor))


def _average_and_postscale_(tensor: torch.Tensor, op: ReduceOp, postscale: float, size: int):
    """Turn a reduced sum into the op's result: floats get `sum * postscale / size`, integers
    `floor(sum / size)` then the postscale."""
    if op == Average:
        if tensor.is_floating_point() or tensor.is_complex():
            _scale_(tensor, postscale / size)
            return
        if size != 1:
            tensor.div_(size, rounding_mode="floor")
    _scale_(tensor, postscale)


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _start_allreduce(
    ctx: WorkerContext,
    tensor: torch.Tensor,
    inplace: bool,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    compression: type[Compressor],
) -> _Pending:
    size = ctx.size
    buf, cctx = compression.compress(tensor)
    averaged_early = False
    if not buf.is_contiguous():
        buf = buf.contiguous()
        _scale_(buf, prescale)
    elif not inplace and _shares_storage(buf, tensor):
        if buf.is_floating_point():
            # The copy a new result needs also applies the scaling (and, for Average, the
            # division): one pass over the data instead of up to three.
            averaged_early = op == Average
            buf = torch.mul(buf, prescale / size if averaged_early else prescale)
        else:
            buf = buf.clone()
            _scale_(buf, prescale)
    else:
        _scale_(buf, prescale)
    works = []
    if buf.numel() > 0:
        works.append(dist.all_reduce(buf, op=_torch_op(op), group=ctx.group, async_op=True))

    def finish() -> torch.Tensor:
        out = compression.decompress(buf, cctx)
        if averaged_early:
            _scale_(out, postscale)
        else:
            _average_and_postscale_(out, op, postscale, size)
        if inplace:
            if out is not tensor:
                tensor.copy_(out)
            return tensor
        return out

    return works, finish


class _AllreduceFunction(torch.autograd.Function):
    """Differentiable allreduce: the gradient is allreduced with the same op and factors."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, op: ReduceOp, pre: float, post: float):
        fctx.op, fctx.pre, fctx.post = op, pre, post
        ctx = current("hvd.allreduce")
        return _complete(_start_allreduce(ctx, tensor, False, op, pre, post, Compression.none))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        if fctx.op not in (Average, Sum):
            raise NotImplementedError("allreduce is differentiable only for Average and Sum")
        reduced = allreduce(grad, op=fctx.op, prescale_factor=fctx.pre, postscale_factor=fctx.post)
        return reduced, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce `tensor` over all ranks into a new tensor; `tensor` is not modified.

    `op` is Average (default), Sum, Min, Max or Product; the result is
    `postscale * op(prescale * tensor)`. Integer Average is floor division. Differentiable
    for Average and Sum. Raises `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.allreduce")
    op = _resolve_op(op, average)
    if tensor.requires_grad and torch.is_grad_enabled():
        compressed, cctx = compression.compress(tensor)
        reduced = _AllreduceFunction.apply(compressed, op, prescale_factor, postscale_factor)
        return compression.decompress(reduced, cctx)
    pending = _start_allreduce(
        ctx, tensor, False, op, prescale_factor, postscale_factor, compression
    )
    return _complete(pending)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    compression: type[Compressor] = Compression.none,
) -> Handle:
    """Start `allreduce`; `synchronize(handle)` returns the new reduced tensor."""
    ctx = current("hvd.allreduce_async")
    op = _resolve_op(op, average)
    return Handle(
        _start_allreduce(ctx, tensor, False, op, prescale_factor, postscale_factor, compression)
    )


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce `tensor` in place over all ranks and return it. Raises `RuntimeError` if a
    peer dies (the tensor's contents are then unspecified)."""
    ctx = current("hvd.allreduce_")
    op = _resolve_op(op, average)
    return _complete(
        _start_allreduce(ctx, tensor, True, op, prescale_factor, postscale_factor, Compression.none)
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start `allreduce_`; `synchronize(handle)` returns `tensor`, reduced in place."""
    ctx = current("hvd.allreduce_async_")
    op = _resolve_op(op, average)
    return Handle(
        _start_allreduce(ctx, tensor, True, op, prescale_factor, postscale_factor, Compression.none)
    )


# --- grouped allreduce ----------------------------------------------------------------------


def _start_grouped_allreduce(
    ctx: WorkerContext,
    tensors: Sequence[torch.Tensor],
    inplace: bool,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    compression: type[Compressor],
) -> _Pending:
    """One fused allreduce per (device, dtype) among `tensors`, in order of first appearance."""
    tensors = list(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    parts = []
    works: list[dist.Work] = []
    for indices in groups.values():
        members = [tensors[i] for i in indices]
        flat = torch.cat([t.reshape(-1) for t in members])
        part_works, finish = _start_allreduce(ctx, flat, True, op, prescale, postscale, compression)
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


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reduce a list of tensors (fused into one buffer per dtype and device) into new tensors.

    Same semantics as `allreduce` per tensor; not differentiable. Raises `RuntimeError` if a
    peer dies.
    """
    ctx = current("hvd.grouped_allreduce")
    op = _resolve_op(op, average)
    return _complete(
        _start_grouped_allreduce(
            ctx, tensors, False, op, prescale_factor, postscale_factor, compression
        )
    )


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    compression: type[Compressor] = Compression.none,
) -> Handle:
    """Start `grouped_allreduce`; `synchronize(handle)` returns the list of new tensors."""
    ctx = current("hvd.grouped_allreduce_async")
    op = _resolve_op(op, average)
    return Handle(
        _start_grouped_allreduce(
            ctx, tensors, False, op, prescale_factor, postscale_factor, compression
        )
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reduce a list of tensors in place and return it. Raises `RuntimeError` if a peer dies."""
    ctx = current("hvd.grouped_allreduce_")
    op = _resolve_op(op, average)
    return _complete(
        _start_grouped_allreduce(
            ctx, tensors, True, op, prescale_factor, postscale_factor, Compression.none
        )
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start `grouped_allreduce_`; `synchronize(handle)` returns the list, reduced in place."""
    ctx = current("hvd.grouped_allreduce_async_")
    op = _resolve_op(op, average)
    return Handle(
        _start_grouped_allreduce(
            ctx, tensors, True, op, prescale_factor, postscale_factor, Compression.none
        )
    )


# --- allgather ------------------------------------------------------------------------------


def _shape_signature(tensor: torch.Tensor) -> int:
    """A number equal on two ranks when dtype kind, itemsize and shape[1:] are equal.

    Python hashes tuples of ints and bools the same in every process (no hash seed).
    """
    return hash(
        (
            tensor.dim(),
            tuple(tensor.shape[1:]),
            tensor.element_size(),
            tensor.is_floating_point(),
            tensor.is_complex(),
        )
    )


def _gather_ints(ctx: WorkerContext, values: list[int]) -> list[list[int]]:
    """Blocking allgather of a few integers per rank (through Gloo on CPU); rows in rank order."""
    mine = torch.tensor(values, dtype=torch.int64)
    out = torch.empty(ctx.size * len(values), dtype=torch.int64)
    _wait(dist.all_gather_single(out, mine, group=ctx.group, async_op=True))
    return out.view(ctx.size, len(values)).tolist()


def _start_allgather(ctx: WorkerContext, tensor: torch.Tensor) -> _Pending:
    """The first-dimension sizes are exchanged before this returns; the data asynchronously.

    The result is `(gathered, first_dims_by_rank)`.
    """
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension")
    rows = _gather_ints(ctx, [tensor.shape[0], _shape_signature(tensor)])
    if any(row[1] != rows[0][1] for row in rows):
        raise ValueError(
            "allgather: the ranks' tensors differ in dtype, rank or shape beyond dimension 0"
        )
    dims = [row[0] for row in rows]
    longest = max(dims)
    rest = tensor.shape[1:]
    source = tensor.contiguous()
    if longest * rest.numel() == 0:
        empty = source.new_empty((sum(dims), *rest))
        return [], lambda: (empty, dims)
    even = all(d == longest for d in dims)
    if even:
        send = source
    else:
        send = source.new_empty((longest, *rest))
        send[: source.shape[0]].copy_(source)
    out = source.new_empty((ctx.size * longest, *rest))
    works = [dist.all_gather_single(out, send, group=ctx.group, async_op=True)]

    def finish() -> tuple[torch.Tensor, list[int]]:
        if even:
            return out, dims
        pieces = [out[r * longest : r * longest + d] for r, d in enumerate(dims)]
        return torch.cat(pieces), dims

    return works, finish


class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged over ranks, then this rank's rows."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor):
        ctx = current("hvd.allgather")
        out, dims = _complete(_start_allgather(ctx, tensor))
        fctx.dims, fctx.rank = dims, ctx.rank
        return out

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        reduced = allreduce(grad.contiguous(), op=Average)
        offset = sum(fctx.dims[: fctx.rank])
        return reduced.narrow(0, offset, fctx.dims[fctx.rank])


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dimension 0, in rank order.

    Dimension 0 may differ between ranks; other dimensions and the dtype must match (else
    `ValueError` on every rank). Differentiable. Raises `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.allgather")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFunction.apply(tensor)
    return _complete(_start_allgather(ctx, tensor))[0]


def allgather_async(tensor: torch.Tensor, name: str | None = None) -> Handle:
    """Start `allgather` (the sizes are exchanged before it returns); `synchronize(handle)`
    returns the concatenated tensor."""
    ctx = current("hvd.allgather_async")
    works, finish = _start_allgather(ctx, tensor)
    return Handle((works, lambda: finish()[0]))


# --- broadcast ------------------------------------------------------------------------------


def _check_root(ctx: WorkerContext, root_rank: int) -> None:
    if not 0 <= root_rank < ctx.size:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {ctx.size})")


def _start_broadcast(
    ctx: WorkerContext, tensor: torch.Tensor, root_rank: int, inplace: bool
) -> _Pending:
    _check_root(ctx, root_rank)
    if inplace:
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    elif ctx.rank == root_rank:
        buf = tensor.clone(memory_format=torch.contiguous_format)
    else:
        buf = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    works = []
    if buf.numel() > 0:
        works.append(dist.broadcast(buf, group=ctx.group, group_src=root_rank, async_op=True))

    def finish() -> torch.Tensor:
        if inplace and buf is not tensor:
            tensor.copy_(buf)
            return tensor
        return buf

    return works, finish


class _BroadcastFunction(torch.autograd.Function):
    """Differentiable broadcast: the root gets the averaged gradient, other ranks zeros."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, root_rank: int):
        ctx = current("hvd.broadcast")
        fctx.is_root = ctx.rank == root_rank
        return _complete(_start_broadcast(ctx, tensor, root_rank, False))

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor):
        reduced = allreduce(grad.contiguous(), op=Average)
        if not fctx.is_root:
            reduced.zero_()
        return reduced, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Return a new tensor holding `root_rank`'s `tensor`; `tensor` is not modified.

    Shapes and dtypes must match on all ranks. Differentiable. Raises `ValueError` for a root
    outside the job, `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFunction.apply(tensor, root_rank)
    return _complete(_start_broadcast(ctx, tensor, root_rank, False))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> Handle:
    """Start `broadcast`; `synchronize(handle)` returns the new tensor."""
    ctx = current("hvd.broadcast_async")
    return Handle(_start_broadcast(ctx, tensor, root_rank, False))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite `tensor` with `root_rank`'s value and return it. Raises `RuntimeError` if a
    peer dies (the tensor's contents are then unspecified)."""
    ctx = current("hvd.broadcast_")
    return _complete(_start_broadcast(ctx, tensor, root_rank, True))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> Handle:
    """Start `broadcast_`; `synchronize(handle)` returns `tensor`, overwritten in place."""
    ctx = current("hvd.broadcast_async_")
    return Handle(_start_broadcast(ctx, tensor, root_rank, True))


# --- alltoall -------------------------------------------------------------------------------


def _start_alltoall(
    ctx: WorkerContext, tensor: torch.Tensor, splits: torch.Tensor | Iterable[int] | None
) -> _Pending:
    """The splits are exchanged before this returns; the data asynchronously.

    The result is `(output, received_splits)`.
    """
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    n, rows = ctx.size, tensor.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(
                f"alltoall without splits needs dimension 0 ({rows}) divisible by size ({n})"
            )
        send = [rows // n] * n
    else:
        values = splits.tolist() if isinstance(splits, torch.Tensor) else splits
        send = [int(s) for s in values]
        if len(send) != n or min(send) < 0 or sum(send) != rows:
            raise ValueError(
                f"alltoall splits {send} must be {n} non-negative counts summing to {rows}"
            )
    signature = _shape_signature(tensor)
    meta = torch.tensor([[count, signature] for count in send], dtype=torch.int64)
    peer_meta = torch.empty_like(meta)
    _wait(dist.all_to_all_single(peer_meta, meta, group=ctx.group, async_op=True))
    received = peer_meta.tolist()
    if any(row[1] != signature for row in received):
        raise ValueError(
            "alltoall: the ranks' tensors differ in dtype, rank or shape beyond dimension 0"
        )
    recv = [row[0] for row in received]
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    received_splits = torch.tensor(recv, dtype=split_dtype)
    source = tensor.contiguous()
    out = source.new_empty((sum(recv), *source.shape[1:]))
    works = []
    if source.shape[1:].numel() > 0:
        works.append(
            dist.all_to_all_single(
                out,
                source,
                output_split_sizes=recv,
                input_split_sizes=send,
                group=ctx.group,
                async_op=True,
            )
        )
    return works, lambda: (out, received_splits)


class _AlltoallFunction(torch.autograd.Function):
    """Differentiable alltoall: gradients travel back along the received splits."""

    @staticmethod
    def forward(fctx: Any, tensor: torch.Tensor, splits: Any):
        ctx = current("hvd.alltoall")
        out, received = _complete(_start_alltoall(ctx, tensor, splits))
        fctx.received = received
        fctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor, _unused: Any):
        ctx = current("hvd.alltoall")
        back, _ = _complete(_start_alltoall(ctx, grad.contiguous(), fctx.received))
        return back, None


def alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | Sequence[int] | None = None,
    name: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send rows of `tensor` to every rank and receive theirs, as Horovod 0.28.

    `splits[i]` rows (in order, along dimension 0) go to rank i; without splits dimension 0
    is divided equally (it must be divisible by size). Returns the received rows in rank
    order, and, only when `splits` is given, also `received_splits` (rows from each rank;
    `splits`' dtype if it is a tensor, else int32). Differentiable. Raises `ValueError` for
    invalid splits, `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.alltoall")
    if tensor.requires_grad and torch.is_grad_enabled():
        out, received = _AlltoallFunction.apply(tensor, splits)
    else:
        out, received = _complete(_start_alltoall(ctx, tensor, splits))
    return out if splits is None else (out, received)


def alltoall_async(
    tensor: torch.Tensor,
    splits: torch.Tensor | Sequence[int] | None = None,
    name: str | None = None,
) -> Handle:
    """Start `alltoall` (splits are exchanged before it returns); `synchronize(handle)`
    returns `(output, received_splits)` whether or not splits were given, as Horovod."""
    ctx = current("hvd.alltoall_async")
    return Handle(_start_alltoall(ctx, tensor, splits))


# --- objects and barrier --------------------------------------------------------------------


def _pickled(obj: Any) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
    )


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Return `root_rank`'s `obj` on every rank (the root gets its own object back).

    Uses pickle, which is safe here only because peers are the job's own authenticated
    workers. Tensors inside keep their device. Raises `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.broadcast_object")
    _check_root(ctx, root_rank)
    is_root = ctx.rank == root_rank
    payload = _pickled(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    _wait(dist.broadcast(length, group=ctx.group, group_src=root_rank, async_op=True))
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    _wait(dist.broadcast(payload, group=ctx.group, group_src=root_rank, async_op=True))
    if is_root:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Return every rank's `obj` as a list in rank order (pickled, like `broadcast_object`).

    Raises `RuntimeError` if a peer dies.
    """
    ctx = current("hvd.allgather_object")
    gathered, dims = _complete(_start_allgather(ctx, _pickled(obj)))
    blob = gathered.numpy()
    objects, offset = [], 0
    for dim in dims:
        objects.append(pickle.loads(blob[offset : offset + dim].tobytes()))
        offset += dim
    return objects


def barrier() -> None:
    """Return once every rank has called `barrier()`. Raises `RuntimeError` if a peer dies."""
    ctx = current("hvd.barrier")
    _wait(dist.all_reduce(torch.zeros(1), group=ctx.group, async_op=True))
