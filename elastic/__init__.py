"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch.

`elastic.driver` is the launcher (`elasticrun`), `elastic.worker` runs inside each training
process, `elastic.torch` is the Horovod-style facade users import as `hvd`, and
`elastic.protocol` is the only thing the driver and the worker share: the wire contract.
"""

__version__ = "0.1.0"
