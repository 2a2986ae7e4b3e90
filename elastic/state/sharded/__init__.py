"""Sharded elastic state: models no rank holds whole (FSDP2), committed in host memory,
replicated to other hosts, and re-sharded in the running processes when the job changes
size.

`ShardedState` (in `sharded_state`) holds a model sharded by `fully_shard` over a 1-D
DeviceMesh, its optimizer, plain values and samplers. What it promises:

* a commit survives the loss of any `replicas` hosts at once: each rank's shards are copied,
  in the background, to `replicas` ranks on other hosts (`placement`, `replication`); the
  training never waits for the copy unless it commits again before the copy is over;
* after every re-form (a shrink, a grow, a rollback) the model, the optimizer state and its
  step counts are bitwise those of the newest commit every shard of which survived
  (`recovery_plan`), laid out for the new number of ranks (`rows`, `resharding`), in the
  running processes, without a disk;
* memory: a rank keeps its own share of the state and `replicas` shares of others' (about
  `(1 + replicas)` times its share at rest), and twice that while a commit is being
  replicated (the commit before stays until the new one is held everywhere);
* a peer that dies inside FSDP2's own collectives (forward, backward) raises
  `WorkerLostError` like any other collective's (`fsdp_comms`, CPU meshes);
* what it cannot do is said in one line: bad input (`ShardedStateError`, at the first build
  or commit: `checks`), and more hosts lost than replicas cover (`ShardsLostError`).
* with a checkpoint directory, durable checkpoints in `torch.distributed.checkpoint`'s
  format are written in the background (`durable_checkpoint`, `checkpoint_files`); more
  hosts lost than replicas cover then resume from the newest, at any world size.

Nothing here is imported by the Horovod-style path: `elastic.torch.elastic` imports it on
first use of its names.
"""

from elastic.state.sharded.errors import ShardedStateError, ShardsLostError
from elastic.state.sharded.sharded_state import RestoredCommit, ShardedState

__all__ = ["RestoredCommit", "ShardedState", "ShardedStateError", "ShardsLostError"]
