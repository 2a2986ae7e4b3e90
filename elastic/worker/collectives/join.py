"""`hvd.join()`: a rank that has run out of data waits for the others while taking part in
their allreduces with zeros, as Horovod's join does, so that ranks with uneven data finish.

A joined rank answers each call's description (`checks.py`) with a JOINED row; then,
for an allreduce (Average or Sum) it contributes zeros of the row's dtype and size, for a
`DistributedOptimizer` step zero gradients, and it applies that step's reduced gradients
too, so its parameters stay equal to the others'; for a barrier nothing more. Averages
still divide by the number of ranks, joined ones included. Other collectives (allgather,
broadcast, alltoall, reducescatter) cannot run while a rank has joined, as in Horovod:
the ranks that call one raise the same `CollectiveArgumentError`, and the joined ranks stay
in `join()`. Once every rank has joined, `join()` returns on each the same rank: the one
that joined last (the highest of those that joined at the same moment).

It needs the cross-rank check (on by default): without it a joined rank cannot see what the
others call. A lost peer meanwhile raises `WorkerLostError`, as any collective does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from elastic.worker import context
from elastic.worker.collectives.checks import (
    DEVICE,
    DTYPE,
    DTYPES,
    JOINED,
    KIND,
    NUMEL,
    OP,
    Call,
    Kind,
    collective_checks,
    decide,
    exchange,
)
from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.negotiation import launch_deferred, pending_codes
from elastic.worker.collectives.process_sets import Scope, global_process_set, scope
from elastic.worker.collectives.wire_dtypes import wire_dtype
from elastic.worker.errors import CollectiveArgumentError

__all__ = ["join"]

_NEWLY, _ALREADY = 1, 2  # a joined row: first exchange since join() was called, or a later one


def join(device: int = -1) -> int:
    """Wait until every rank has called `join()`, taking part in the others' allreduces and
    optimizer steps meanwhile, as Horovod's.

    The others' calls that cannot run while a rank has joined (allgather, broadcast, alltoall,
    reducescatter, other ops than Average and Sum) raise `CollectiveArgumentError` on those
    ranks; this one keeps waiting.

    Args:
        device: accepted for Horovod compatibility (the zeros go where the others' tensors are).

    Returns:
        The rank that joined last (the same on every rank).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the cross-rank check is off (`hvd.set_collective_checks`), or
            the others step a `DistributedOptimizer` this rank does not have.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = context.current("hvd.join")
    if not collective_checks():
        raise CollectiveArgumentError(
            "hvd.join needs the cross-rank check of collectives (hvd.set_collective_checks)"
        )
    where = scope(ctx, global_process_set, "hvd.join")
    joined = Call(Kind.JOINED, [])
    state = _NEWLY
    while True:
        row = joined.row(pending_codes(ctx, where))
        row[JOINED] = state
        rows = exchange(where, row)
        state = _ALREADY
        decision = decide(rows, where.members)
        if decision.launch:
            launch_deferred(ctx, where, decision.launch)
            continue
        if decision.problem is not None or decision.defer:
            continue  # the calling ranks raise (or defer); this one stays joined
        active = [r for r in rows if r[KIND] != Kind.JOINED]
        if not active:
            newly = [where.members[i] for i, r in enumerate(rows) if r[JOINED] == _NEWLY]
            return max(newly) if newly else where.members[-1]
        _take_part(where, active[0], ctx.device)


def _take_part(where: Scope, call: list[int], device: torch.device) -> None:
    """Contribute zeros to the call the active ranks make (the check allowed it)."""
    on = device if call[DEVICE] else torch.device("cpu")
    if call[KIND] == Kind.ALLREDUCE:
        dtype = wire_dtype(DTYPES[call[DTYPE]])
        zeros = torch.zeros(call[NUMEL], dtype=dtype, device=on)
        if zeros.numel():
            wait(dist.all_reduce(zeros, group=where.group, async_op=True))
    elif call[KIND] == Kind.STEP:
        optimizers = context.process_wide().optimizers
        optimizer = optimizers[call[OP]]() if 0 <= call[OP] < len(optimizers) else None
        if optimizer is None:
            raise CollectiveArgumentError(
                "hvd.join: the others step a DistributedOptimizer this rank does not have"
            )
        optimizer.step_joined()
