"""`horovod.common.exceptions` under elasticrun: the names Horovod scripts catch.

`HorovodInternalError` is `WorkerLostError` (a peer was lost or the round broke: the run
loop restores and re-joins); `HostsUpdatedInterrupt` is the project's own class.
"""

from elastic.worker.errors import CollectiveArgumentError, HostsUpdatedInterrupt, WorkerLostError

HorovodInternalError = WorkerLostError

__all__ = [
    "CollectiveArgumentError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
]
