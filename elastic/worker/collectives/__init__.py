"""Horovod-semantics collectives over `torch.distributed` (Gloo on CPU, NCCL on CUDA): the
one place the worker API's collectives are gathered.

Every call first reads the process-wide `WorkerContext` (so it raises `NotInitializedError`
before `init()`), takes an optional `process_set` (all ranks by default) and passes that
set's group explicitly to torch.distributed.

Ordering: torch.distributed matches operations by the order in which ranks issue them. Every
rank of a call's process set must issue the same collectives in the same order; by default
a direct call checks this before it moves data (`negotiation.py`), so a mismatch, or
arguments of one rank that cannot work, raises `CollectiveArgumentError` (a `RuntimeError`
and a `ValueError`) with the same message on every rank instead of hanging. `name` keys the
operation, as in Horovod: a name still in flight on a rank is refused there, and a named
asynchronous call that the other ranks make later (after a barrier, say) waits for them.

Failures: a lost peer or a broken round raises `WorkerLostError` (Horovod's
`HorovodInternalError`); the elastic run loop restores and re-joins. A usage error is never
reported as `WorkerLostError`.
"""
