"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch.

A job is one driver process and a worker process per slot. The driver (`elastic.driver`, the
`elasticrun` command) finds hosts, launches workers, forms *rounds* (the job's membership,
each with every worker's rank) and forms the next one when a worker dies, joins or leaves.
Each worker runs the user's script over the worker runtime (`elastic.worker`: joining rounds,
the process group, the collectives) and the elastic state (`elastic.state`: commits, the
`hvd.elastic.run` loop that restores and re-syncs after a change), both reached through the
Horovod-style facade users import as `hvd` (`elastic.torch`). `elastic.protocol` is the only
thing the driver and the workers share: the wire contract. `elastic.common` holds Horovod's
exception names. `elastic.run_job` runs a Python function on every rank of a job and returns
each rank's value.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["JobFailedError", "run_job"]


def __getattr__(name: str) -> Any:
    """`run_job` and `JobFailedError`, imported when first used: a worker process that imports
    `elastic.torch` loads nothing of the launch side."""
    if name in __all__:
        from elastic import function_job

        return getattr(function_job, name)
    raise AttributeError(f"module 'elastic' has no attribute {name!r}")
