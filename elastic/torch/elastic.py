"""`hvd.elastic`: Horovod Elastic's names for the elastic run loop and its state, and
`DistributedDataParallel`, a DDP model that follows the rounds (imported on first use, so
that Horovod-style scripts load none of it)."""

from typing import TYPE_CHECKING, Any

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.state.run_loop import run
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError
from elastic.worker.training.ddp_checks import UnsupportedModelError

if TYPE_CHECKING:  # imported on first use: see __getattr__
    from elastic.worker.training.ddp import DistributedDataParallel

HorovodInternalError = WorkerLostError

__all__ = [
    "DistributedDataParallel",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
