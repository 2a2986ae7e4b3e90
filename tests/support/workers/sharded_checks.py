"""What the sharded-model tests check, as a user would: the gathered full state of a
`ShardedState` (parameters, Adam's moments and step counts) and a bit-for-bit comparison."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


def full_state(state: Any) -> dict[str, torch.Tensor]:
    """The gathered full state, flattened to name -> tensor: copies in host memory (a
    collective; a peer's death raises the collective's RuntimeError)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    flat = {f"model.{k}": _whole(v) for k, v in model_sd.items()}
    for name, values in optim_sd["state"].items():
        flat.update({f"optim.{name}.{k}": _whole(v) for k, v in values.items()})
    return flat


def _whole(value: Any) -> torch.Tensor:
    """A copy in host memory of the whole of `value`; a DTensor's shards are gathered over a
    CPU mesh of its group (torch 2.11's functional all-gather of CUDA tensors over Gloo, which
    `full_tensor()` on the GPU mesh would use, crashes: tests/gpu runs several ranks that way)."""
    if not isinstance(value, DTensor):
        return torch.as_tensor(value).detach().cpu().clone()
    host_mesh = DeviceMesh.from_group(value.device_mesh.get_group(), "cpu")
    local = value.to_local().detach().cpu()
    whole = DTensor.from_local(
        local, host_mesh, value.placements, run_check=False, shape=value.shape,
        stride=value.stride(),
    ).full_tensor()  # fmt: skip
    return whole.clone()


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ in any bit (dtype and shape included), or are on one
    side only; sorted."""
    names = set(a) ^ set(b)
    for name in set(a) & set(b):
        x, y = a[name], b[name]
        same = x.dtype == y.dtype and x.shape == y.shape
        if not same or not torch.equal(_bits(x), _bits(y)):
            names.add(name)
    return sorted(names)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)
