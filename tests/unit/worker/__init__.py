"""elastic/worker: the worker runtime's parts that run in this process."""
