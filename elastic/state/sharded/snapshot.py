"""What a commit keeps of a sharded model and optimizer, and how it becomes live state again.

A snapshot is a `Manifest` (the same on every rank of a commit) and this rank's rows of
every tensor sharded on dimension 0 (a DTensor of the model's or the optimizer's state
dict; `rows.row_range` of its global shape), which `slots.Block.pack` copies to host memory. The
manifest's `skeleton` is both state dicts with each sharded tensor replaced by a `Ref` to
its place in the list; tensors that are not sharded (Adam's step counts, the model's
buffers) and plain values (the optimizer's parameter groups) stay in the skeleton, copied,
and come back from old rank 0's manifest: they are the same on every rank.

Two names for one tensor (tied parameters) become one `Ref`, so the pair stays tied.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from elastic.state.sharded.rows import row_range
from elastic.state.torch_state import host_snapshot

__all__ = ["Manifest", "Ref", "TensorMeta", "state_dicts", "take", "tied_names"]


@dataclass(frozen=True)
class Ref:
    """The place of a sharded tensor in a snapshot's list of blocks."""

    index: int


@dataclass(frozen=True)
class TensorMeta:
    """A sharded tensor's global shape, stride and dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def local_shape(self, world: int, rank: int) -> tuple[int, ...]:
        """The shape of `rank`'s block when `world` ranks share the tensor."""
        start, stop = row_range(self.shape[0], world, rank)
        return (stop - start, *self.shape[1:])

    def local_bytes(self, world: int, rank: int) -> int:
        return _numel(self.local_shape(world, rank)) * self.dtype.itemsize


@dataclass
class Manifest:
    """The layout of one commit: its sharded tensors (`tensors[i]` is `Ref(i)`) and the
    skeleton `{"model": ..., "optimizer": ...}` of both state dicts."""

    tensors: list[TensorMeta]
    skeleton: dict[str, Any]

    def total_bytes(self) -> int:
        """The bytes of every sharded tensor, all ranks' blocks together."""
        return sum(_numel(meta.shape) * meta.dtype.itemsize for meta in self.tensors)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _walk(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` (nested dicts, lists and tuples) with every other value replaced by
    `leaf(value)`; a dict's `_metadata` (Module.state_dict's versions) is kept."""
    if isinstance(value, dict):
        items = [(key, _walk(item, leaf)) for key, item in value.items()]
        out: dict[Any, Any] = OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
        if hasattr(value, "_metadata"):
            out._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
        return out
    if type(value) in (list, tuple):
        return type(value)(_walk(item, leaf) for item in value)
    return leaf(value)


def take(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Manifest, list]:
    """Snapshot `model` and `optimizer` (sharded by FSDP2, see `checks.check_sharding`):
    the manifest, in host memory, and this rank's local shards of every sharded tensor,
    live (the caller copies them: `slots.Block.pack`, before training changes them)."""
    metas: list[TensorMeta] = []
    locals_: list[torch.Tensor] = []

    def to_ref(value: Any) -> Any:
        if not isinstance(value, DTensor):
            return value
        metas.append(TensorMeta(tuple(value.shape), tuple(value.stride()), value.dtype))
        locals_.append(value.to_local())
        return Ref(len(metas) - 1)

    first_name = tied_names(model)
    model_state = model.state_dict()
    model_skeleton: dict[str, Any] = OrderedDict()
    for name, value in model_state.items():
        tied = first_name.get(name, name)
        model_skeleton[name] = model_skeleton[tied] if tied in model_skeleton else to_ref(value)
    model_skeleton._metadata = getattr(model_state, "_metadata", None)  # type: ignore[attr-defined]
    skeleton = {"model": model_skeleton, "optimizer": _walk(optimizer.state_dict(), to_ref)}
    return Manifest(metas, host_snapshot(skeleton, None)), locals_


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """For each parameter reachable under several names, each later name -> the first."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(param), name)
    return {name: tied for name, tied in out.items() if name != tied}


def state_dicts(
    manifest: Manifest, blocks: Sequence[torch.Tensor], mesh: DeviceMesh
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state dicts of a snapshot, over `mesh`: each `Ref`
    becomes a DTensor sharded on dimension 0 whose local tensor is this rank's block (moved
    to the mesh's device, else used as it is: the caller gives the blocks up), each other
    tensor a copy (training changes step counts in place)."""
    device = torch.device(mesh.device_type)

    def to_value(value: Any) -> Any:
        if isinstance(value, Ref):
            meta = manifest.tensors[value.index]
            local = blocks[value.index].to(device)
            return DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=meta.shape, stride=meta.stride
            )
        if isinstance(value, torch.Tensor):
            return value.clone()
        return copy.deepcopy(value)

    restored = _walk(manifest.skeleton, to_value)
    return restored["model"], restored["optimizer"]
