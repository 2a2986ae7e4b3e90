"""Reduction operations with Horovod's values and arithmetic, over any dtype Horovod supports.

Horovod's rules, kept here: `Average` sums first and divides after (floor division for
integers); the result is `postscale * op(prescale * tensor)`; integer tensors are scaled in
float64 and truncated. The dtype a reduction is computed in is `wire_dtypes.wire_dtype`.
"""

from __future__ import annotations

import enum

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
    "finish_",
    "resolve_op",
    "scale_",
    "torch_op",
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
