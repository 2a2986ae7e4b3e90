"""torch.distributed calls whose names differ between the torch versions elasticrun supports."""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist

__all__ = ["all_gather_single", "ddp_without_own_sync", "set_group_timeout"]

# torch 2.13 renamed all_gather_into_tensor (same arguments); older versions have only it.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# torch 2.14 made the collective timeout of an existing group public as set_timeout(timeout,
# group) and deprecated the private _set_pg_timeout (same arguments), which now warns on use.
set_group_timeout = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout


def ddp_without_own_sync() -> dict[str, Any]:
    """`DistributedDataParallel` arguments that turn off its own broadcasts (of the module's
    state at construction, of its buffers before each forward). torch 2.13 renamed
    `broadcast_buffers` to `forward_sync_buffers` and deprecated the old name, which warns."""
    from torch.nn.parallel import DistributedDataParallel  # only where DDP is used

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    buffers = (
        "forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers"
    )
    return {"init_sync": False, buffers: False}
