"""Compression applied to tensors around an allreduce, with Horovod's Compressor API.

A compressor turns the tensor to reduce into the tensor that travels (`compress`) and the
reduced result back into the caller's type (`decompress`). `DistributedOptimizer` compresses
each fused gradient buffer once per step; `allreduce` compresses the tensor it is given.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: `compress(t) -> (t', ctx)` before the collective, `decompress(t', ctx)` after.

    Both are static methods (as in Horovod), so a compressor is passed as a class, not an
    instance. `compress` may return `t` itself; callers that must not modify `t` copy it.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and casts the result back; others unchanged.

    Values beyond float16's range (about 65504) overflow to inf during the reduction: use
    `prescale_factor` (or `gradient_predivide_factor`) to keep sums in range.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The built-in compressors: `Compression.none` (default) and `Compression.fp16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
