"""The two errors of sharded state: bad input, and state that no survivor holds."""

from __future__ import annotations

from elastic.errors import ElasticError


class ShardedStateError(ElasticError, ValueError):
    """The sharded state cannot be committed as given: a model not sharded the documented way
    (FSDP2's `fully_shard` over the mesh `build` is given), a mesh of a fixed size, shared
    parameters the resharding cannot follow, more replicas than the job has other hosts, or
    a state too large for the host memory its replicas need. Raised on every rank alike, at
    the first commit (or the first build), with one line that names what to change."""


class ShardsLostError(ElasticError, RuntimeError):
    """No commit survives whole: some shard of every commit was held only by workers that are
    gone (more hosts were lost at once than `replicas` covers). Raised on every rank at the
    re-form, when no durable checkpoint loads either (none in the checkpoint directory, or
    no checkpoint directory named: `durable_checkpoint`)."""
