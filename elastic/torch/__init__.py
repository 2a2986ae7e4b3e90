"""The Horovod-style API: `import elastic.torch as hvd`.

A Horovod user changes `import horovod.torch as hvd` to `import elastic.torch as hvd` and
`horovodrun` to `elasticrun`; the names and their meaning are Horovod's. What elasticrun does
not offer (MPI, Adasum, the timeline) raises `NotImplementedError` naming the alternative.

This package only names things: `hvd.init`, the rank queries and the collectives come from
the worker runtime (`elastic.worker`); `DistributedOptimizer`, `SyncBatchNorm`,
`broadcast_parameters` and `broadcast_optimizer_state` from its `training` package;
`hvd.elastic` (`elastic.torch.elastic`) is the elastic run loop and its state
(`elastic.state`). Every name here is public API: it does not change when the modules behind
it move.
"""

from elastic.torch import elastic
from elastic.worker.capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from elastic.worker.collectives.allgathers import (
    allgather,
    allgather_async,
    grouped_allgather,
    grouped_allgather_async,
)
from elastic.worker.collectives.allreduces import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
)
from elastic.worker.collectives.alltoalls import alltoall, alltoall_async
from elastic.worker.collectives.barrier import barrier
from elastic.worker.collectives.broadcasts import (
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
)
from elastic.worker.collectives.checks import collective_checks, set_collective_checks
from elastic.worker.collectives.compression import Compression
from elastic.worker.collectives.grouped_allreduces import (
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from elastic.worker.collectives.handles import Handle, poll, synchronize
from elastic.worker.collectives.join import join
from elastic.worker.collectives.objects import allgather_object, broadcast_object
from elastic.worker.collectives.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from elastic.worker.collectives.reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from elastic.worker.collectives.reducescatters import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from elastic.worker.collectives.sparse_allreduce import sparse_allreduce_async
from elastic.worker.config import NotLaunchedError
from elastic.worker.context import NotInitializedError
from elastic.worker.errors import (
    CollectiveArgumentError,
    HostsUpdatedInterrupt,
    WorkerLostError,
)
from elastic.worker.runtime import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from elastic.worker.training.optimizer import DistributedOptimizer
from elastic.worker.training.state_broadcasts import (
    broadcast_optimizer_state,
    broadcast_parameters,
)
from elastic.worker.training.sync_batch_norm import SyncBatchNorm

HorovodInternalError = WorkerLostError

__all__ = [
    "Adasum",
    "Average",
    "CollectiveArgumentError",
    "Compression",
    "DistributedOptimizer",
    "Handle",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "NotInitializedError",
    "NotLaunchedError",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNorm",
    "WorkerLostError",
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
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "collective_checks",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "set_collective_checks",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
