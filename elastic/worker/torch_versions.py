"""torch.distributed calls whose names differ between the torch versions elasticrun supports."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["all_gather_single"]

# torch 2.13 renamed all_gather_into_tensor (same arguments); older versions have only it.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
