"""What `ShardedState` checks of a model before it commits it, and of the host memory its
commits need: one clear line (`ShardedStateError`) rather than a hang or a wrong state at
the first re-form."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from elastic.state.sharded.errors import ShardedStateError

__all__ = ["available_memory", "check_sharding", "memory_problem"]

_HOW = (
    "build(mesh) must apply fully_shard(module, mesh=mesh) to the model (its blocks, then its root)"
)


def check_sharding(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, mesh: DeviceMesh
) -> None:
    """Raise `ShardedStateError` unless every parameter of `model` is a DTensor sharded on
    dimension 0 over `mesh` (FSDP2's `fully_shard(module, mesh=mesh)`), no two parameters
    share memory without being the same parameter, and `optimizer` updates the model's
    parameters only."""
    if not isinstance(model, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise ShardedStateError(
            f"build(mesh) returned ({type(model).__name__}, {type(optimizer).__name__}): it must "
            "return (model, optimizer), a torch.nn.Module and a torch.optim.Optimizer"
        )
    world = mesh.size()
    storages: dict[tuple[int, int], str] = {}
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            raise ShardedStateError(f"ShardedState: parameter {name!r} is not sharded: {_HOW}")
        placements = tuple(param.placements)
        if param.device_mesh.ndim != 1 or placements != (Shard(0),):
            raise ShardedStateError(
                f"ShardedState: parameter {name!r} is placed {placements} over a "
                f"{param.device_mesh.ndim}-D mesh; ShardedState re-shards FSDP2's Shard(0) "
                f"over a 1-D mesh only: {_HOW}"
            )
        if param.device_mesh.mesh.tolist() != mesh.mesh.tolist():
            raise ShardedStateError(
                f"ShardedState: parameter {name!r} is sharded over a mesh of "
                f"{param.device_mesh.size()} rank(s), this round has {world}: build(mesh) must "
                "shard over the mesh it is given, not one it makes with a fixed size"
            )
        local = param.to_local()
        if local.numel():
            key = (local.untyped_storage().data_ptr(), local.storage_offset())
            if key in storages:
                raise ShardedStateError(
                    f"ShardedState: parameters {storages[key]!r} and {name!r} share memory "
                    "without being one parameter; re-sharding cannot keep them shared: tie them "
                    "as one parameter (a.weight = b.weight) before fully_shard, or untie them"
                )
            storages[key] = name
    owned = {id(param) for param in model.parameters()}
    for group in optimizer.param_groups:
        if any(id(param) not in owned for param in group["params"]):
            raise ShardedStateError(
                "ShardedState: the optimizer updates a parameter the model does not hold: "
                "build(mesh) must make the optimizer from model.parameters() after fully_shard"
            )


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's available memory in bytes (psutil's where installed, else the kernel's
    MemAvailable); None where neither says."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_problem(
    share: int,
    held: int,
    replicas: int,
    local_size: int,
    host: str,
    available: Callable[[], int | None] = available_memory,
) -> str | None:
    """Why this rank's commits do not fit its host's memory (one line), or None.

    At its peak (while a commit is replicated, until every rank has it) a rank keeps two
    commits: `2 * (1 + replicas)` times its `share` (bytes of its blocks). It holds `held`
    bytes already; its host's `local_size` ranks share what `available()` reports."""
    free = available()
    if free is None:
        return None
    need = 2 * (1 + replicas) * share
    if (need - held) * local_size <= free:
        return None
    gib = 1 << 30
    return (
        f"ShardedState(replicas={replicas}): commits need about {need / gib:.2f} GiB of host "
        f"memory per rank at their peak (2 x (1 + replicas) x this rank's {share / gib:.2f} GiB "
        f"share of the state), and host {host} has {free / gib:.2f} GiB available for its "
        f"{local_size} worker(s): lower replicas, shard over more ranks, or free host memory"
    )
