"""Elastic training state: what workers commit, restore after a failure and sync to joiners,
and the loop that does it (`hvd.elastic.run`).

A `State` (`ObjectState` for plain objects, `TorchState` for models, optimizers, LR schedulers
and `ElasticSampler`s) lives in host memory on every worker. `commit()` snapshots it (a
*commit*; with a checkpoint directory, commits are also written to disk as *checkpoints*,
`durable`) and checks, collectively, whether the membership is about to change. The run loop
(`run_loop`) calls the training function; when a peer dies it restores the last commit, joins
the next round and syncs the state from the rank that holds the newest commit; when the
membership changes at a commit or a step, it re-joins without restoring. `ElasticSampler`
shards each data epoch over the round's ranks and remembers which samples were processed.

What it promises: every rank of a round commits at the same step, so the ranks at the same
commit count hold the same state; a joiner never becomes the source of a sync while some rank
holds a commit; nothing committed is lost while one rank that holds it survives.

This package builds on `elastic.worker` (the collectives, the round's context); the worker
runtime knows nothing of it.
"""

from elastic.state.sampler import ElasticSampler
from elastic.state.state import ObjectState, State
from elastic.state.torch_state import TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState"]
