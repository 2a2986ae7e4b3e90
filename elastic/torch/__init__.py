"""The Horovod-style API: `import elastic.torch as hvd`.

A Horovod user changes `import horovod.torch as hvd` to `import elastic.torch as hvd` and
`horovodrun` to `elasticrun`; the names and their meaning are Horovod's.
"""

from elastic.worker.config import NotLaunchedError
from elastic.worker.context import NotInitializedError
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

__all__ = [
    "NotInitializedError",
    "NotLaunchedError",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]
