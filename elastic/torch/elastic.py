"""`hvd.elastic`: Horovod Elastic's names for the elastic run loop and its state."""

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.worker.elastic_run import run
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError

__all__ = [
    "ElasticSampler",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "WorkerLostError",
    "run",
]
