"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch.

`elastic.driver` is the launcher (`elasticrun`), `elastic.worker` runs inside each training
process, `elastic.torch` is the Horovod-style facade users import as `hvd`, and
`elastic.protocol` is the only thing the driver and the worker share: the wire contract.
`elastic.run_job` runs a Python function on every rank of a job and returns each rank's value.
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
