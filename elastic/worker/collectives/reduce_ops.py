"""Reduction operations with Horovod's values and arithmetic, over any dtype Horovod supports.

Horovod's rules, kept here: `Average` sums first and divides after (floor division for
integers); the result is `postscale * op(prescale * tensor)`; integer tensors are scaled in
float64 and truncated. Dtypes a backend cannot reduce (Gloo lacks int16; NCCL lacks int16 and
bool) are reduced in a wider type and cast back; data-moving collectives send the bytes of any
dtype (`as_bytes`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "as_bytes",
    "finish_",
    "resolve_op",
    "scale_",
    "torch_op",
    "wire_dtype",
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


def resolve_op(op: int | None, average: bool | None) -> ReduceOp:
    """The op a call asked for: `op`, else the deprecated `average` flag, else Average.

    Raises `ValueError` for both at once, `NotImplementedError` for Adasum."""
    if op is not None and average is not None:
        raise ValueError("pass either op or the deprecated average argument, not both")
    if op is None:
        return Average if average is None or average else Sum
    resolved = ReduceOp(op)
    if resolved == Adasum:
        raise NotImplementedError(
            "Adasum is not supported by elasticrun: use Average (or Sum with a scaled "
            "learning rate)"
        )
    return resolved


def torch_op(op: ReduceOp) -> dist.ReduceOp.RedOpType:
    """The torch.distributed op that computes `op` before `finish_` (Average is a sum)."""
    if op in (Average, Sum):
        return dist.ReduceOp.SUM
    if op == Min:
        return dist.ReduceOp.MIN
    if op == Max:
        return dist.ReduceOp.MAX
    return dist.ReduceOp.PRODUCT


# Reductions neither Gloo nor NCCL can compute in these dtypes: done in the wider one.
_WIDER = {torch.int16: torch.int32, torch.bool: torch.int32}


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reduction of `dtype` is computed in (`dtype` itself where backends can)."""
    return _WIDER.get(dtype, dtype)


# Dtypes that are moved as their bytes: Gloo lacks int16, NCCL int16 and bool.
_AS_BYTES = {torch.int16, torch.bool}


def as_bytes(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """A contiguous view of `tensor` that any backend can move, and how to turn a tensor moved
    that way (any first dimension) back into `tensor`'s dtype and trailing shape.

    Dtypes backends handle are returned as they are; others travel as uint8 rows of the same
    first dimension, so concatenating and splitting along dimension 0 keeps working.
    """
    source = tensor.contiguous()
    if source.dtype not in _AS_BYTES:
        return source, _unchanged
    dtype, rest = source.dtype, source.shape[1:] if source.dim() else ()
    rows = source.reshape(source.shape[0] if source.dim() else 1, -1)
    wire = rows.view(torch.uint8) if rows.numel() else rows.to(torch.uint8)

    def restore(moved: torch.Tensor) -> torch.Tensor:
        if moved.numel() == 0:
            return torch.empty((moved.shape[0], *rest), dtype=dtype, device=moved.device)
        back = moved.contiguous().view(dtype)
        return back.reshape(tensor.shape if not tensor.dim() else (moved.shape[0], *rest))

    return wire, restore


def _unchanged(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place; integer tensors are scaled in float64 and truncated, as Horovod."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(tensor.double().mul_(factor))


def finish_(tensor: torch.Tensor, op: ReduceOp, postscale: float, size: int) -> None:
    """Turn a reduced tensor into the op's result in place: for Average, floats get
    `sum * postscale / size` and integers `floor(sum / size)` then the postscale; other ops
    only the postscale."""
    if op == Average:
        if tensor.is_floating_point() or tensor.is_complex():
            scale_(tensor, postscale / size)
            return
        if size != 1:
            tensor.div_(size, rounding_mode="floor")
    scale_(tensor, postscale)
