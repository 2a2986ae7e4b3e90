"""Reducing a DDP module's gradient buckets over the round's ranks, through the runtime's wait.

Left to itself, `DistributedDataParallel` waits for its gradient allreduces at the end of
backward in one blocking call: a dead peer surfaces as a plain `RuntimeError` (which ends the
worker instead of re-forming), a hung one blocks until the collective timeout. Its
communication hook (`register_comm_hook`) is the documented place to take the reduction
over: `reduce_bucket` launches each bucket's allreduce asynchronously, as DDP's own hook
does (divide by the round's size, then sum), and at the step's last bucket waits for every
bucket of the step through `handles.wait` (short slices, the round's broken flag, peer
probes), so that DDP's own wait then finds them done. DDP launches buckets strictly in
bucket order, the same on every rank, so the last bucket's hook runs after all the others.

What happens when a peer dies: `loss.backward()` raises `WorkerLostError` (the autograd
engine keeps the type of an exception a hook raises), within 10 ms of the driver's word that
the round is broken at the latest; `hvd.elastic.run` restores the last commit and re-joins.
The step's gradients are then partly reduced, and the DDP that ran it is not used again.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects
# (`bucket: dist.GradBucket`, returning `torch.futures.Future[torch.Tensor]`).

import torch
import torch.distributed as dist

from elastic.worker.collectives.handles import wait
from elastic.worker.context import WorkerContext

__all__ = ["BucketReduction", "reduce_bucket"]


class BucketReduction:
    """The communication hook's state for one round's DDP: the round and this step's works."""

    __slots__ = ("_ctx", "_works")

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._works: list[dist.Work] = []

    def launch(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Start `bucket`'s allreduce (an average over the round); at the last bucket, wait
        for every bucket of the step. Raises `WorkerLostError` (see the module's docstring)."""
        if bucket.index() == 0:
            self._works.clear()  # works of a step that failed before its last bucket
        buffer = bucket.buffer()
        buffer.div_(self._ctx.size)
        work = dist.all_reduce(buffer, group=self._ctx.group, async_op=True)
        self._works.append(work)
        if bucket.is_last():
            works, self._works = self._works, []
            for launched in works:
                wait(launched)
        return work.get_future().then(_reduced)


def _reduced(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return done.value()[0]


def reduce_bucket(
    reduction: BucketReduction, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: `ddp.register_comm_hook(BucketReduction(ctx), reduce_bucket)`."""
    return reduction.launch(bucket)
