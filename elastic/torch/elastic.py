"""`hvd.elastic`: Horovod Elastic's names for the elastic run loop and its state."""

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.state.run_loop import run
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError

HorovodInternalError = WorkerLostError

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "WorkerLostError",
    "run",
]
