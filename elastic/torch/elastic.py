"""`hvd.elastic`: Horovod Elastic's names for the elastic run loop and its state."""

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.worker.elastic_run import run
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
