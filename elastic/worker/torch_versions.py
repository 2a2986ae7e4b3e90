"""torch.distributed calls whose names differ between the torch versions elasticrun supports."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["all_gather_single", "set_group_timeout"]

# torch 2.13 renamed all_gather_into_tensor (same arguments); older versions have only it.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# torch 2.14 made the collective timeout of an existing group public as set_timeout(timeout,
# group) and deprecated the private _set_pg_timeout (same arguments), which now warns on use.
set_group_timeout = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
