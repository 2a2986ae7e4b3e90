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
    """Return once every rank of `process_set` has called `barrier()`.

    Args:
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: another member called a different collective at this point
            (raised on every rank).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.barrier")
    where, rows = checked(ctx, process_set, Kind.BARRIER, "hvd.barrier", [])
    if rows is None:
        wait(dist.all_reduce(torch.zeros(1), group=where.group, async_op=True))
