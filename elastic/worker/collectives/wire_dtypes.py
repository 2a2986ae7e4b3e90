"""The dtype a tensor travels in: dtypes a backend cannot reduce or move, in one that it can.

Gloo lacks int16, NCCL int16 and bool. A reduction of such a tensor is computed in a wider
dtype and cast back (`wire_dtype`); a collective that only moves data (allgather, broadcast,
alltoall) sends its bytes (`as_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["as_bytes", "wire_dtype"]


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
