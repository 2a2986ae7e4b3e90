"""Horovod's collectives over the round's process group (Gloo on CPU, NCCL on CUDA), and what
they do when a peer dies.

Every call reads the process-wide `WorkerContext` (so it raises `NotInitializedError` before
`init()`), takes an optional `process_set` (all ranks by default; `process_sets`) and passes
that set's group to torch.distributed explicitly. One module per family: `allreduces`,
`grouped_allreduces`, `reducescatters`, `sparse_allreduce`, `allgathers`, `broadcasts`,
`alltoalls`, `objects`, `barrier`, `join`. Under them: the ops and their arithmetic
(`reduce_ops`), the dtype a tensor travels in (`wire_dtypes`), the unchecked gather of rows
(`row_gather`), and `handles`, the one place that waits on torch.distributed (`synchronize`,
`poll`). `compression` is the Compressor API that allreduce takes.

Ordering: torch.distributed matches operations by the order in which ranks issue them. Every
rank of a call's process set must issue the same collectives in the same order; by default
a direct call checks this before it moves data (`checks`, `negotiation`), so a mismatch, or
arguments of one rank that cannot work, raises `CollectiveArgumentError` (a `RuntimeError`
and a `ValueError`) with the same message on every rank instead of hanging. `name` keys the
operation, as in Horovod: a name still in flight on a rank is refused there, and a named
asynchronous call that the other ranks make later (after a barrier, say) waits for them
(`in_flight`).

Failures, the contract every public function's `Raises` states for itself:

* a peer dies, or stops answering, while a call runs: the call raises `WorkerLostError` (a
  `RuntimeError`; Horovod's `HorovodInternalError`), within tens of milliseconds where the
  kernel resets the dead peer's connections, else as soon as the driver declares the round
  broken (it learns of a death from the process's exit, its control stream or its missed
  heartbeats, and of a partition from the peers' probes). Ranks that were not exchanging
  data with the dead peer at that moment raise it too when the round is declared broken;
* the round is broken from then on: its group is not to be used again. `hvd.elastic.run`
  restores the last commit, joins the next round and syncs the state;
* an asynchronous call raises it from `synchronize(handle)`; an in-place call leaves its
  tensor's contents unspecified;
* a call that outlasts `--collective-timeout` raises `RuntimeError`;
* a usage error (`CollectiveArgumentError`, `ValueError`, `NotImplementedError`) is never
  reported as `WorkerLostError`: the run loop does not catch it, and the worker exits.
"""
