"""ShardedState: the elastic state of a model sharded with FSDP2, which no rank holds whole.

The user gives `build(mesh) -> (model, optimizer)`: it makes the model, applies
`fully_shard(module, mesh=mesh)` with the mesh it is given, and makes the optimizer from the
sharded parameters. The state calls it once per round, with that round's mesh (all of the
round's ranks, 1-D, over the round's process group, which the worker runtime forms anew each
round), so `state.model` and `state.optimizer` are new objects after every re-form: the
training function reads them each time it is called. `build` must not use collectives.

Contract:
* `commit()` snapshots this rank's shards (parameters, optimizer state with its step counts,
  buffers) and its plain values and samplers into host memory, then replicates them in the
  background to `replicas` ranks on other hosts (`placement`, `replication`); the next
  commit waits for that replication only if it is still in flight.
* At every new round (`sync_if_needed`, which the run loop calls after each re-join) the
  ranks agree, from what each holds, on the newest commit every shard of which some rank
  holds (`recovery_plan`), rebuild the model for the new mesh and move each shard's rows to
  its new owner (`resharding`): parameters, optimizer state and step counts are then bitwise
  those of that commit, on every world size. A joiner holds nothing and receives its rows.
  `last_restore` says which commit it was.
* When no commit survives whole (more hosts lost at once than `replicas` covers) the job
  goes on from the newest durable checkpoint, where a checkpoint directory is named
  (`checkpoint_dir` or `--checkpoint-dir`: `durable_checkpoint`), and rank 0 says so in one
  line; without one every rank raises `ShardsLostError`. A job that starts with checkpoints
  in its directory starts from the newest. Bad input raises `ShardedStateError` on every
  rank at the first commit (`checks`; the run loop's first sync takes it) or at the re-form
  that finds it.
* At a re-form agreed at a step boundary (a notice, a drain, a member leaving), the state
  after that step is committed first (`prepare_to_reform`), so nothing is rolled back.
* `restore()` (after a lost peer) rolls back plain values and samplers at once; the model and
  optimizer roll back at the next round's re-form, which rebuilds them anyway.
* Reset callbacks run after the re-form, so they see the new model, optimizer and size.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from elastic.state.sampler import merge_sampler_states
from elastic.state.sharded.checks import available_memory, memory_problem, sharding_problem
from elastic.state.sharded.durable_checkpoint import (
    DurableCheckpoints,
    optimizer_step,
    resume_line,
)
from elastic.state.sharded.errors import ShardedStateError, ShardsLostError
from elastic.state.sharded.fsdp_comms import elastic_comms
from elastic.state.sharded.placement import check_replicas, place_replicas
from elastic.state.sharded.recovery_plan import Choice, SlotId, choose, describe_loss
from elastic.state.sharded.replication import Replicator
from elastic.state.sharded.resharding import reshard
from elastic.state.sharded.slots import Block, Slot, Slots
from elastic.state.sharded.snapshot import Manifest, state_dicts, take
from elastic.state.state import ObjectState, State
from elastic.state.torch_state import TorchState, _SamplerHandler
from elastic.worker import context
from elastic.worker.collectives.objects import allgather_object
from elastic.worker.context import WorkerContext
from elastic.worker.errors import WorkerLostError
from elastic.worker.group.process_group import create_round_subgroup

__all__ = ["RestoredCommit", "ShardedState"]

log = logging.getLogger("elastic")

# What `build` makes, never a plain value of the state.
_BUILT_BY_BUILD = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)

Build = Callable[[DeviceMesh], tuple[torch.nn.Module, torch.optim.Optimizer]]


@dataclass(frozen=True)
class RestoredCommit:
    """The commit the last re-form went on from: its count when it was taken (`commit`; the
    state's `commit_count` may be higher, it never goes back), the number of ranks that
    took it, and where each shard came from."""

    commit: int
    world: int
    reason: str


class ShardedState(TorchState):
    """Elastic state of an FSDP2 model: `ShardedState(build, replicas=1, checkpoint_dir=None,
    **values)`.

    `build(mesh)` returns `(model, optimizer)` sharded over `mesh` (see the module's
    docstring); other keyword arguments are plain values and `ElasticSampler`s, as in
    `TorchState`. `host_memory` caps the bytes of host memory the commits of a host's
    ranks may use together (default: what the host has available when the state is
    checked). `checkpoint_dir` (else the launcher's `--checkpoint-dir`, with its cadence and
    number kept) gets durable checkpoints in DCP's format (`durable_checkpoint`). Needs
    `hvd.init()` first. Raises `ShardedStateError` at once when a value is a module,
    optimizer or LR scheduler (those come from `build`) or `replicas` is negative; a `build`
    that does not shard the documented way, `replicas` of as many hosts as the job has, or
    commits too large for host memory raise it on every rank at the first commit (the run
    loop's first sync).
    """

    def __init__(
        self,
        build: Build,
        replicas: int = 1,
        host_memory: int | None = None,
        checkpoint_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        for name, value in kwargs.items():
            if isinstance(value, _BUILT_BY_BUILD):
                raise ShardedStateError(
                    f"ShardedState({name}=...): models and optimizers come from build(mesh); "
                    "LR schedulers are not kept by ShardedState yet"
                )
        if replicas < 0:
            raise ShardedStateError(f"ShardedState(replicas={replicas}): must be 0 or more")
        ctx = context.current("ShardedState")
        super().__init__(**kwargs)
        # Durable checkpoints (durable_checkpoint.py) take the place of TorchState's commits.
        self._durable = None
        self._checkpoints = DurableCheckpoints.from_settings(checkpoint_dir)
        self._build, self._replicas = build, replicas
        self._host_memory = host_memory
        self._problem: str | None = None  # what is wrong with the model built for the round
        self._in_commit = False
        self._slots = Slots()
        self._replicator: Replicator | None = None
        self._built_for: tuple[int, int] | None = None
        self._mesh: DeviceMesh | None = None
        self._checked_bytes = -1
        self._callbacks_due = False
        self.last_restore: RestoredCommit | None = None
        self._rebuild(ctx)

    @property
    def durable_checkpoints(self) -> DurableCheckpoints | None:
        """The writer and loader of durable checkpoints (None without a checkpoint
        directory): `written`, the newest commit whose checkpoint this rank saw finished;
        `error`, the last write's failure; `wait()`, for the write in flight."""
        return self._checkpoints

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("model", "optimizer") and "_slots" in self.__dict__:
            raise AttributeError(
                f"ShardedState.{name} comes from build(mesh), made again at every re-form"
            )
        super().__setattr__(name, value)

    # --- the round --------------------------------------------------------------------------

    def _rebuild(self, ctx: WorkerContext) -> None:
        """Build the model and optimizer for `ctx`'s round, unless they are built for it."""
        key = (ctx.round, ctx.formation)
        if self._built_for == key:
            return
        mesh = init_device_mesh(ctx.device.type, (ctx.size,))
        built = self._build(mesh)
        if not isinstance(built, tuple | list) or len(built) != 2:
            built = (None, None)
            self._problem = "build(mesh) must return (model, optimizer)"
        else:
            self._problem = sharding_problem(built[0], built[1], mesh)
            if self._problem is None:  # a dead peer in forward/backward: WorkerLostError
                elastic_comms(built[0], mesh.device_type)
        object.__setattr__(self, "model", built[0])
        object.__setattr__(self, "optimizer", built[1])
        self._mesh, self._built_for = mesh, key

    def _enter_round(self, ctx: WorkerContext, hosts: list[str], first: bool) -> None:
        """Place the replicas over `hosts` and form the round's replication group (a
        collective: every rank calls it with the same hosts)."""
        if first:
            check_replicas(hosts, self._replicas)
        placement = place_replicas(hosts, self._replicas)
        if self._replicas and not placement.across_hosts and ctx.rank == 0:
            log.warning(
                "ShardedState: %d host(s) in round %d, fewer than replicas=%d + 1: some "
                "replicas are on their own host, so a lost host loses state",
                len(set(hosts)), ctx.round, self._replicas,
            )  # fmt: skip
        if not any(placement.holders):
            return
        round_ = ctx.round
        group = create_round_subgroup(
            timedelta(seconds=ctx.timeout), lambda: ctx.events.broken(round_)
        )
        context.bury(group)  # its thread may still wait on a dead peer when the round ends
        self._replicator = Replicator(
            group, ctx.rank, placement, lambda: ctx.events.broken(round_), ctx.timeout
        )

    def _stop_replication(self) -> None:
        if self._replicator is not None:
            self._replicator.stop()
            self._replicator = None

    # --- commits ----------------------------------------------------------------------------

    def save(self) -> None:
        """Snapshot the commit `commit()` is about to count, and start replicating it (after
        the replication of the one before, if still in flight: its failure raises
        `WorkerLostError`)."""
        if self._replicator is not None:
            self._replicator.wait()
        TorchState.save(self)
        ctx = context.current("ShardedState.commit")
        count = self._commit_count + 1
        self._take(ctx, SlotId(count, ctx.round), count)
        if self._checkpoints is not None:  # durable checkpoints (durable_checkpoint.py)
            plain = self._plain_values()
            self._checkpoints.at_commit(ctx, count, self.model, self.optimizer, plain)

    def _plain(self) -> bytes:
        return pickle.dumps(self._plain_values())

    def _plain_values(self) -> dict[str, Any]:
        """This rank's plain values and samplers, as commits and durable checkpoints keep
        them."""
        samplers = {
            name: handler.saved
            for name, handler in self._handlers.items()
            if isinstance(handler, _SamplerHandler)
        }
        return {"objects": self._saved, "samplers": samplers}

    def _take(self, ctx: WorkerContext, slot_id: SlotId, origin: int, check: bool = False) -> None:
        """Snapshot this rank's blocks as `slot_id` and replicate them; `check` the memory
        they need whatever was checked before (every rank passes the same)."""
        manifest, shards = take(self.model, self.optimizer)
        block = self._slots.pack(shards, self._plain())
        self._check_memory(ctx, manifest, block, check)
        slot = Slot(slot_id, origin, ctx.size, manifest, ctx.rank, {ctx.rank: block})
        self._slots.add(slot)
        if self._replicator is None:
            self._slots.keep_only([slot_id])
        else:
            self._replicator.start(self._slots, slot)

    def _check_memory(
        self, ctx: WorkerContext, manifest: Manifest, block: Block, check: bool
    ) -> None:
        """At every re-form, and at a commit whose state grew since (the same on every rank,
        which a re-form leaves with the same `_checked_bytes`): does each host have the
        memory its ranks' commits need? One allgather; every rank raises the first problem."""
        total = manifest.total_bytes()
        if total <= self._checked_bytes and not check:
            return
        self._checked_bytes = total
        if self._host_memory is None:
            held, available = self._slots.nbytes(), available_memory
        else:  # a cap on what the commits use in all: what they hold already counts
            held, available = 0, lambda: self._host_memory
        problem = memory_problem(
            block.nbytes(), held, self._replicas, ctx.slot.local_size, ctx.slot.hostname,
            available,
        )  # fmt: skip
        found = [p for p in allgather_object(problem) if p is not None]
        if found:
            raise ShardedStateError(found[0])

    def commit(self) -> None:
        """`State.commit`: snapshot, count, replicate in the background, then check for host
        updates (a re-form it triggers goes on from this commit)."""
        self._in_commit = True
        try:
            super().commit()
        finally:
            self._in_commit = False

    def wait_replicated(self) -> None:
        """Block until the last commit is held by all its replica holders (the training
        never needs to; a test or a benchmark may). Raises `WorkerLostError` when a peer
        died meanwhile."""
        if self._replicator is not None:
            self._replicator.wait()

    def finish_background(self) -> None:
        """The training function returned: finish replicating the last commit before the
        process group goes (a peer lost meanwhile only abandons the replication)."""
        try:
            self.wait_replicated()
        except WorkerLostError as err:
            log.warning("ShardedState: the last commit's replication was abandoned: %s", err)
        self._stop_replication()

    def _counts_steps(self) -> bool:
        """A lost peer's shards of the live state are gone (only commits are replicated), so
        the survivors always roll back to the newest commit held whole: `--rollback step`
        does not apply here."""
        return False

    def restore(self) -> None:
        """Roll plain values and samplers back to the last commit, and abandon the
        replication in flight; the model and optimizer are rolled back by the next round's
        re-form (`sync_if_needed`)."""
        self._stop_replication()
        TorchState.restore(self)

    def prepare_to_reform(self, members_leave: bool = True) -> None:
        """Every rank agreed to re-form at a step boundary, while the round still works:
        merge the samplers (`TorchState`) and, when `members_leave`, finish replicating the
        last commit (a leaver takes its own shards with it). Outside `commit()` (at
        `check_host_updates()`, or a step a leaving member interrupts) the live state is newer
        than the last commit: it becomes a commit first, so the re-form goes on from the
        state after that step. When the round only grows, every shard of that commit stays
        with its taker, so its replication is abandoned (the next round replicates anew; the
        commit before, replicated whole, is kept until then): the incumbents do not wait for
        it (4 s of a 12 s stall at ~98M parameters on 2 cores). A peer's death meanwhile
        raises `WorkerLostError` (the run loop rolls back to the last commit held whole)."""
        TorchState.prepare_to_reform(self, members_leave)
        if not self._in_commit:
            self.save()
            self._commit_count += 1
            ctx = context.current("ShardedState.prepare_to_reform")
            if ctx.on_commit is not None:
                ctx.on_commit(self._commit_count)
        if self._replicator is not None and members_leave:
            self._replicator.wait()
        else:
            self._stop_replication()

    def on_reset(self) -> None:
        """Defer the reset callbacks until the re-form has rebuilt the model."""
        self._callbacks_due = True

    # --- re-forms ---------------------------------------------------------------------------

    def sync_if_needed(self, needed: bool) -> None:
        """Re-form the state for the current round, whatever `needed` says (the model is
        bound to the round's group): agree on the newest commit held whole, rebuild, move
        the shards, reload plain values and samplers. A collective.

        Raises `ShardsLostError` when no commit is held whole, `WorkerLostError` when a peer
        dies meanwhile (the holders keep what they hold for the next try)."""
        ctx = context.current("ShardedState.sync")
        self._stop_replication()
        optimizer = self.__dict__.get("optimizer")  # the step reached, before the rebuild
        live_step = optimizer_step(optimizer) if optimizer is not None else None
        self._rebuild(ctx)  # local: build(mesh) uses no collectives
        survey = allgather_object(
            (ctx.slot.hostname, self._slots.held(), self._commit_count, ctx.job_commit,
             self._problem)
        )  # fmt: skip
        if problems := [problem for *_, problem in survey if problem is not None]:
            raise ShardedStateError(problems[0])
        hosts = [host for host, *_ in survey]
        held_by = [held for _, held, *_ in survey]
        newest = max(max(commit, job) for _, _, commit, job, _ in survey)
        choice = choose(held_by)
        if choice is None and self._resume_durable(ctx, hosts, newest, live_step):
            return  # went on from a durable checkpoint (durable_checkpoint.py)
        self._rebuild(ctx)  # anew if a failed load wrote into the model
        if choice is None and newest > 0:
            self._no_commit_survives(describe_loss(held_by, self._replicas))
        # The job's start (nobody holds a commit) checks `replicas` against its hosts; a
        # re-form that lost commit 0 before the first commit (only commit 0 existed, not held
        # whole) starts over from build() on the hosts left, as a shrink does.
        self._enter_round(ctx, hosts, first=choice is None and not any(held_by))
        if choice is None:  # the state as build() made it is commit 0
            if any(held_by):  # plain values and samplers are back at commit 0 (restore())
                self._reshard_samplers()
                if ctx.rank == 0:
                    log.warning(
                        "ShardedState: commit 0 was not held whole by the workers left (hosts "
                        "lost before the first commit): starting over from build()"
                    )
            self._slots.keep_only(())
            self._commit_count = 0
            self._take(ctx, SlotId(0, ctx.round), 0, check=True)
        else:
            self._load(ctx, choice)
            self._commit_count = max(newest, choice.slot.commit)
            if self._commit_count > choice.slot.commit and ctx.rank == 0:
                log.warning(
                    "training state lost: commit %d was not held whole by the workers left; "
                    "going on from commit %d",
                    self._commit_count, choice.origin,
                )  # fmt: skip
            slot_id = SlotId(self._commit_count, ctx.round)
            if slot_id != choice.slot:
                self._slots.keep_only([choice.slot])
                self._take(ctx, slot_id, choice.origin, check=True)
            if ctx.on_commit is not None:
                ctx.on_commit(self._commit_count)
        if self._callbacks_due:
            self._callbacks_due = False
            State.on_reset(self)

    def _no_commit_survives(self, why: str) -> None:
        """No commit is held whole, and no durable checkpoint loads: every rank raises
        `ShardsLostError`."""
        checkpoints = self._checkpoints
        disk = (
            f"no durable checkpoint in {checkpoints.directory.url} could be loaded"
            if checkpoints is not None
            else "name a checkpoint directory (--checkpoint-dir) to resume from disk"
        )
        raise ShardsLostError(f"ShardedState: {why}; the job cannot go on from memory ({disk})")

    def _resume_durable(
        self, ctx: WorkerContext, hosts: list[str], newest: int, live_step: int | None
    ) -> bool:
        """No commit is held whole, or the job starts: go on from the newest durable
        checkpoint where there is one (`durable_checkpoint`), loaded into the model built for
        this round, and say so; `live_step` is the optimizer's step this rank had reached
        (None where it keeps none). A collective; False (nothing changed) when none loads."""
        checkpoints = self._checkpoints
        if checkpoints is None:
            return False
        resumed, reached, tried = checkpoints.resume(ctx, self.model, self.optimizer, live_step)
        if resumed is None:
            if tried:  # a failed load may have written into the model: build it anew
                self._built_for = None
            return False
        self._enter_round(ctx, hosts, first=newest == 0)
        self._slots.keep_only(())
        self._commit_count = max(newest, resumed.commit)
        self._load_plain(resumed.plain)
        self._take(ctx, SlotId(self._commit_count, ctx.round), resumed.commit, check=True)
        reason = f"the durable checkpoint of commit {resumed.commit} in {resumed.url}"
        self.last_restore = RestoredCommit(resumed.commit, resumed.world, reason)
        if ctx.on_commit is not None:
            ctx.on_commit(self._commit_count)
        if ctx.rank == 0:
            log.warning(resume_line(resumed, self._replicas, newest > 0, reached, newest))
        if self._callbacks_due:
            self._callbacks_due = False
            State.on_reset(self)
        return True

    def _load(self, ctx: WorkerContext, choice: Choice) -> None:
        """Make `choice`'s commit the live state over this round's mesh."""
        slot = self._slots.get(choice.slot)
        supplied = {}
        if slot is not None:
            supplied = {
                k: slot.blocks[k] for k, src in enumerate(choice.sources) if src == ctx.rank
            }
        manifest = slot.manifest if slot is not None and choice.sources[0] == ctx.rank else None
        shared = allgather_object((manifest, {k: block.plain for k, block in supplied.items()}))
        manifest = next(m for m, _ in shared if m is not None)
        plains: dict[int, bytes] = {}
        for _, part in shared:
            plains.update(part)
        blocks = reshard(choice, manifest.tensors, supplied, ctx.rank, ctx.size, ctx.group)
        assert self._mesh is not None, "built in the constructor"
        model_state, optimizer_state = state_dicts(manifest, blocks, self._mesh)
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)
        self._load_plain([pickle.loads(plains[k]) for k in range(choice.world)])
        self.last_restore = RestoredCommit(choice.origin, choice.world, choice.reason)
        if ctx.rank == 0:
            log.info("ShardedState: %d rank(s) go on from %s", ctx.size, choice.reason)

    def _reshard_samplers(self) -> None:
        """Re-shard every sampler for this round's rank and size."""
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()

    def _load_plain(self, parts: list[dict[str, Any]]) -> None:
        """Plain values from old rank 0; each sampler merged over every old rank's."""
        self._saved = parts[0]["objects"]
        ObjectState.restore(self)
        for name, handler in self._handlers.items():
            if isinstance(handler, _SamplerHandler):
                states = [part["samplers"][name] for part in parts]
                handler.saved = merge_sampler_states(states, 0)
                handler.restore()
                handler.value.unshared = False
