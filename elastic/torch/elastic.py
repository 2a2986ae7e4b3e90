"""`hvd.elastic`: Horovod Elastic's names for the elastic run loop and its state,
`DistributedDataParallel`, a DDP model that follows the rounds, and `ShardedState` for models
no rank holds whole (FSDP2); the last two are imported on first use, so that Horovod-style
scripts load none of it."""

from typing import TYPE_CHECKING, Any

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.state.run_loop import run
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError
from elastic.worker.training.ddp_checks import UnsupportedModelError

if TYPE_CHECKING:  # imported on first use: see __getattr__
    from elastic.state.sharded import (
        RestoredCommit,
        ShardedState,
        ShardedStateError,
        ShardsLostError,
    )
    from elastic.worker.training.ddp import DistributedDataParallel

HorovodInternalError = WorkerLostError

_SHARDED = ("RestoredCommit", "ShardedState", "ShardedStateError", "ShardsLostError")

__all__ = [
    "DistributedDataParallel",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "RestoredCommit",
    "ShardedState",
    "ShardedStateError",
    "ShardsLostError",
    "State",
    "TorchState",
    "UnsupportedModelError",
    "WorkerLostError",
    "run",
]


def __getattr__(name: str) -> Any:
    if name == "DistributedDataParallel":
        from elastic.worker.training.ddp import DistributedDataParallel

        return DistributedDataParallel
    if name in _SHARDED:
        from elastic.state import sharded

        return getattr(sharded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
