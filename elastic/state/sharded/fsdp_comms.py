"""FSDP2's own collectives, routed through the worker runtime's wait.

FSDP2 all-gathers parameters before each forward and backward and reduce-scatters gradients
after, with plain `torch.distributed` calls: when a peer dies, Gloo raises a bare
`RuntimeError` ("Connection reset by peer") from the middle of the user's `forward()` or
`backward()`, which the run loop cannot tell from a bug, and a hung peer blocks it until the
collective timeout. `elastic_comms(model)` gives every FSDP2 unit of `model` an all-gather
and a reduce-scatter (FSDP2's `set_custom_all_gather` / `set_custom_reduce_scatter`) that
issue the same collectives asynchronously and wait for them through
`elastic.worker.collectives.handles.wait`: a lost peer or a broken round raises
`WorkerLostError`, and the run loop rolls back and re-forms.

The reduce-scatter is not Gloo's: Gloo's `reduce_scatter_single` returns a work whose
`wait(timeout)` ignores the timeout and whose `is_completed()` stays False until `wait()`
has run (torch 2.13). A rank blocked in it on a live peer that had gone on to the next round
waited the whole `--collective-timeout` (default 30 min) before it saw the broken round,
and the new round, which waits for it, with it (the ~98M benchmark's killed worker,
`docs/benchmarks.md`). It is an `all_to_all_single` of the input's chunks (each rank
receives every rank's chunk of its part: the bytes a reduce-scatter moves), whose wait
honours the slices, then the reduction of the received chunks on this rank: SUM, AVG, MAX,
MIN and PRODUCT. Any other op (PREMUL_SUM, a gradient divide factor of the user's) goes to
Gloo's reduce-scatter as before.

Only for meshes on the CPU (Gloo). On CUDA, FSDP2's NCCL collectives are ordered on CUDA
streams and overlap the computation; waiting for each on the CPU would give that up, so they
are left as FSDP2 makes them (a dead peer surfaces at the runtime's next collective, whose
wait sees the broken round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from elastic.worker.collectives.handles import wait

try:  # the comm interfaces' public home from torch 2.8 on
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # pragma: no cover - an older torch: FSDP2 keeps its own comms
    AllGather = ReduceScatter = None  # type: ignore[assignment,misc]

__all__ = ["elastic_comms"]


def _allocate(
    size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return torch.empty(*size, dtype=dtype, device=device)


if AllGather is not None:

    class _AllGather(AllGather):  # type: ignore[misc,valid-type]
        """FSDP2's all-gather (`all_gather_single`), waited for by the runtime."""

        allocate = staticmethod(_allocate)

        def __call__(
            self,
            output_tensor: torch.Tensor,
            input_tensor: torch.Tensor,
            group: dist.ProcessGroup,
            async_op: bool = False,
        ) -> None:
            wait(dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True))

    class _ReduceScatter(ReduceScatter):  # type: ignore[misc,valid-type]
        """FSDP2's reduce-scatter (`reduce_scatter_single`), waited for by the runtime."""

        allocate = staticmethod(_allocate)

        def __call__(
            self,
            output_tensor: torch.Tensor,
            input_tensor: torch.Tensor,
            group: dist.ProcessGroup,
            op: dist.ReduceOp,
            async_op: bool = False,
        ) -> None:
            reduce = _local_reduction(op)
            if reduce is None:  # an op of its own (see the module's docstring): Gloo's
                work = dist.reduce_scatter_single(
                    output=output_tensor, input=input_tensor, group=group, op=op, async_op=True
                )
                wait(work)
                return
            world = group.size()
            chunks = input_tensor.reshape(world, -1)
            received = torch.empty_like(chunks)
            wait(dist.all_to_all_single(received, chunks, group=group, async_op=True))
            output_tensor.copy_(reduce(received).reshape(output_tensor.shape))


def _local_reduction(op: object) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How to reduce a `[world, n]` tensor of every rank's chunk over dim 0 as `op` does;
    None for an op this cannot do locally (PREMUL_SUM, a custom op)."""
    reductions: list[tuple[object, Callable[[torch.Tensor], torch.Tensor]]] = [
        (dist.ReduceOp.SUM, lambda t: t.sum(dim=0)),
        (dist.ReduceOp.AVG, lambda t: t.sum(dim=0) / t.shape[0]),
        (dist.ReduceOp.MAX, lambda t: t.amax(dim=0)),
        (dist.ReduceOp.MIN, lambda t: t.amin(dim=0)),
        (dist.ReduceOp.PRODUCT, lambda t: t.prod(dim=0)),
    ]
    for known, reduce in reductions:
        try:
            if op == known:
                return reduce
        except TypeError:  # a ReduceOp object that compares with no op type
            return None
    return None


def elastic_comms(model: torch.nn.Module, device_type: str) -> int:
    """Route the collectives of every FSDP2 unit of `model` through the runtime's wait (CPU
    meshes only, see the module's docstring); returns how many units were changed. A unit
    FSDP2 refuses a custom comm for (several parameter groups) keeps its own."""
    if device_type != "cpu" or AllGather is None:
        return 0
    changed = 0
    all_gather, reduce_scatter = _AllGather(), _ReduceScatter()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            try:
                module.set_custom_all_gather(all_gather)
                module.set_custom_reduce_scatter(reduce_scatter)
            except ValueError:
                continue
            changed += 1
    return changed
