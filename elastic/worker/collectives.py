"""Horovod-semantics collectives over `torch.distributed` (Gloo on CPU, NCCL on CUDA): the
one place the worker API's collectives are gathered.

Every call first reads the process-wide `WorkerContext` (so it raises `NotInitializedError`
before `init()`), takes an optional `process_set` (all ranks by default) and passes that
set's group explicitly to torch.distributed.

Ordering: torch.distributed matches operations by the order in which ranks issue them. Every
rank of a call's process set must issue the same collectives in the same order; by default
a direct call checks this before it moves data (`negotiation.py`), so a mismatch, or
arguments of one rank that cannot work, raises `CollectiveArgumentError` (a `RuntimeError`
and a `ValueError`) with the same message on every rank instead of hanging. `name` keys the
operation, as in Horovod: a name still in flight on a rank is refused there, and a named
asynchronous call that the other ranks make later (after a barrier, say) waits for them.

Failures: a lost peer or a broken round raises `WorkerLostError` (Horovod's
`HorovodInternalError`); the elastic run loop restores and re-joins. A usage error is never
reported as `WorkerLostError`.
"""

from elastic.worker.agreement import collective_checks, set_collective_checks
from elastic.worker.handles import Handle, poll, synchronize
from elastic.worker.handles import wait as _wait
from elastic.worker.movement import (
    allgather,
    allgather_async,
    allgather_object,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allgather,
    grouped_allgather_async,
)
from elastic.worker.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from elastic.worker.reduction import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from elastic.worker.reductions import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)

__all__ = [
    "Adasum",
    "Average",
    "Handle",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "_wait",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "collective_checks",
    "global_process_set",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "set_collective_checks",
    "sparse_allreduce_async",
    "synchronize",
]
