"""What `ShardedState` checks of a model before it commits it, and of the host memory its
commits need: one clear line (`ShardedStateError`) rather than a hang or a wrong state at
the first re-form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from elastic.state.sharded.errors import ShardedStateError

__all__ = ["available_memory", "check_sharding", "memory_problem", "readable", "sharding_problem"]

_HOW = (
    "build(mesh) must apply fully_shard(module, mesh=mesh) to the model (its blocks, then its root)"
)


def check_sharding(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, mesh: DeviceMesh
) -> None:
    """Raise `ShardedStateError` with `sharding_problem`'s line, if it finds one."""
    if (problem := sharding_problem(model, optimizer, mesh)) is not None:
        raise ShardedStateError(problem)


def sharding_problem(model: Any, optimizer: Any, mesh: DeviceMesh) -> str | None:
    """Why `ShardedState` cannot commit `(model, optimizer)` as `build(mesh)` made them (one
    line), or None: every parameter of `model` must be a DTensor sharded on dimension 0 over
    a mesh of `mesh`'s size (FSDP2's `fully_shard(module, mesh=mesh)`; a mesh of a fixed
    size is found at the first re-form that changes the size: DTensors of equal meshes may
    hold either mesh object), no two parameters may share
    memory without being the same parameter, and `optimizer` must update the model's
    parameters only. Local: the answer can differ between ranks only where a rank holds no
    rows of a parameter, so the caller makes it collective (`ShardedState` raises the first
    rank's problem on every rank)."""
    if not isinstance(model, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        return (
            f"build(mesh) returned ({type(model).__name__}, {type(optimizer).__name__}): it must "
            "return (model, optimizer), a torch.nn.Module and a torch.optim.Optimizer"
        )
    storages: dict[tuple[int, int], str] = {}
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            return f"ShardedState: parameter {name!r} is not sharded: {_HOW}"
        placements = tuple(param.placements)
        if param.device_mesh.ndim != 1 or placements != (Shard(0),):
            return (
                f"ShardedState: parameter {name!r} is placed {placements} over a "
                f"{param.device_mesh.ndim}-D mesh; ShardedState re-shards FSDP2's Shard(0) "
                f"over a 1-D mesh only: {_HOW}"
            )
        if param.device_mesh.size() != (world := mesh.size()):
            return (
                f"ShardedState: parameter {name!r} is sharded over a mesh of "
                f"{param.device_mesh.size()} rank(s), this round has {world}: build(mesh) must "
                "shard over the mesh it is given, not one it makes with a fixed size"
            )
        local = param.to_local()
        if local.numel():
            key = (local.untyped_storage().data_ptr(), local.storage_offset())
            if key in storages:
                return (
                    f"ShardedState: parameters {storages[key]!r} and {name!r} share memory "
                    "without being one parameter; re-sharding cannot keep them shared: tie them "
                    "as one parameter (a.weight = b.weight) in one fully_shard unit, or untie them"
                )
            storages[key] = name
    owned = {id(param) for param in model.parameters()}
    for group in optimizer.param_groups:
        if any(id(param) not in owned for param in group["params"]):
            return (
                "ShardedState: the optimizer updates a parameter the model does not hold: "
                "build(mesh) must make the optimizer from model.parameters() after fully_shard"
            )
    return None


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's available memory in bytes: the kernel's MemAvailable (Linux), else
    psutil's where installed; None where neither says."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().available)
    except ImportError:
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
    return (
        f"ShardedState(replicas={replicas}): commits need about {readable(need)} of host "
        f"memory per rank at their peak (2 x (1 + replicas) x this rank's {readable(share)} "
        f"share of the state), and host {host} has {readable(free)} for its {local_size} "
        "worker(s): lower replicas, shard over more ranks, or give the commits more host "
        "memory (ShardedState's host_memory)"
    )


def readable(size: int) -> str:
    """`size` bytes in the largest binary unit that keeps it at 1 or more ("1.50 MiB")."""
    value, unit = float(size), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{int(value)} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
