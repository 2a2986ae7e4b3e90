"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch.

`elastic.driver` is the launcher (`elasticrun`), `elastic.worker` runs inside each training
process, `elastic.torch` is the Horovod-style facade users import as `hvd`, and
`elastic.protocol` is the only thing the driver and the worker share: the wire contract.
`elastic.run_job` runs a Python function on every rank of a job and returns each rank's value.
"""

from elastic.function_job import JobFailedError, run_job

__all__ = ["JobFailedError", "run_job"]

__version__ = "0.1.0"
