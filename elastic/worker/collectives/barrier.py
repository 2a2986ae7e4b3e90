"""Horovod's `barrier`: return once every rank of a process set has called it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from elastic.worker.collectives.checks import Kind
from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.negotiation import checked
from elastic.worker.collectives.process_sets import ProcessSet, global_process_set
from elastic.worker.context import current

__all__ = ["barrier"]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank (of `process_set`) has called `barrier()`."""
    ctx = current("hvd.barrier")
    where, rows = checked(ctx, process_set, Kind.BARRIER, "hvd.barrier", [])
    if rows is None:
        wait(dist.all_reduce(torch.zeros(1), group=where.group, async_op=True))
