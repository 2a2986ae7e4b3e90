"""The worker runtime: what runs inside each training process that `elasticrun` starts.

A worker stays a member of the job for its whole life, while the job's membership changes in
*rounds*. Each round the driver forms gives the worker a slot (rank, size, local rank, ...)
and a process group (Gloo; NCCL too for CUDA tensors). When a round breaks (a peer died, a
host came or went) the worker abandons that group, joins the next round and forms a new
group in the same process: nothing restarts that did not die.

Subpackages, from the wire up:

* `driver_link`: the worker's side of the protocol with the driver: HTTP (joining a round,
  the key-value store), the gRPC control stream, heartbeats, and the mailbox of what the
  driver announced;
* `group`: one round's process group: forming it over the round's store, the interface Gloo
  binds, probing peers when a collective stays blocked;
* `collectives`: Horovod's collectives over that group, and what they do when a peer dies;
* `training`: `DistributedOptimizer`, `SyncBatchNorm`, the state broadcasts.

At the top: `runtime` (`init`, `shutdown`, re-joining, the rank queries), `context` (the one
process-wide context every call reads), `config`, `errors`, `exit`, `preemption`,
`capabilities` and `torch_versions`. The elastic run loop and the state it keeps live in
`elastic.state`, which builds on this package; users reach both through `elastic.torch`.
"""
