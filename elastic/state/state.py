"""What an elastic job commits, rolls back to after a failure, and hands to new members.

A `State` lives in host memory of every worker. The run loop (`hvd.elastic.run`) drives it:

* the training code calls `commit()` every few steps: a snapshot, then a collective check
  for membership changes that makes every rank raise `HostsUpdatedInterrupt` at the same step;
* on `WorkerLostError` the run loop calls `restore()` (back to the last snapshot), re-joins,
  calls `on_reset()` and then `sync()`, which copies the newest commit held by any rank to all;
* on `HostsUpdatedInterrupt` it re-joins and calls `on_reset()`, and `sync()` unless the
  interrupt's `skip_sync` says no worker joined.

Every state carries a commit counter: how many commits its snapshot has seen. A worker that
joins with a fresh state has counter 0, so it never becomes the source of a sync while some
rank holds a commit.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from elastic.state.durable import DurableWriter, durable_writer
from elastic.state.host_messages import HostMessages
from elastic.state.loadable import UnloadableCommit, refusal_of
from elastic.worker import context
from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.objects import broadcast_object
from elastic.worker.collectives.reduce_ops import Max, Sum
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError
from elastic.worker.training import step_boundary

__all__ = ["ObjectState", "State"]

log = logging.getLogger("elastic")


@dataclass(frozen=True)
class _Survey:
    root: int  # the lowest rank holding the newest commit
    newest: int  # that commit count
    job_commit: int  # the newest commit count the job had reached, as the driver knew it
    needed: bool  # a rank asked for a sync, the counts differ, or the job's newest is lost
    durable: int  # the newest durable commit a fresh rank found (0: none looked, none found)
    durable_rank: int  # the lowest rank that found it
    steps: tuple[int, ...]  # each rank's optimizer steps applied to its live state
    kept: bool  # some rank kept its live state after a lost peer (`State.peer_lost`)
    live_root: int | None  # the lowest of the kept consistent ranks with the most steps
    live_needed: bool  # the live states differ (steps, consistency, a joiner, commit counts)


class State:
    """Base class: subclasses implement `save()`, `restore()` and `sync_from(root_rank)`.

    `save`, `restore` and `on_reset` are local. `commit`, `check_host_updates` and `sync`
    are collectives: every rank of the current round must call them in the same order, and
    they raise `NotInitializedError` without an active worker context.
    """

    def __init__(self, checkpoint_dir: str | None = None) -> None:
        self._commit_count = 0
        # Optimizer steps applied to the live state (counted by states that track an
        # optimizer: `_counts_steps`), and to the snapshot.
        self._steps = 0
        self._saved_steps = 0
        # After a lost peer, whether this rank kept its live state ("consistent" or not:
        # see `peer_lost`); None: it rolled back, or nothing was lost.
        self._kept: str | None = None
        self._torn = False  # a sync into this rank's live state was cut off
        self._reset_callbacks: list[Callable[[], None]] = []
        self._durable = durable_writer(checkpoint_dir)

    @property
    def _host_messages(self) -> HostMessages:
        """Horovod's queue of pending host updates, which its elastic scripts poll for the
        driver's word (`while state._host_messages.empty(): ...`): not empty once a host
        change is pending for this worker, until `commit()` acts on it (see `HostMessages`)."""
        return HostMessages()

    @property
    def commit_count(self) -> int:
        """How many commits the current snapshot represents (0: never committed)."""
        return self._commit_count

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Add functions that `on_reset()` calls, in order, after every re-formed round (e.g. to
        rescale the learning rate to the new `hvd.size()`)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by the run loop once a new round is formed, before `sync()`: runs the reset
        callbacks. An exception from a callback propagates to the run loop."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Snapshot the state to host memory, count the commit, then `check_host_updates()`.

        Commits copy data (from the GPU, for tensors there): commit every few steps, trading
        the cost of a commit against the steps lost when a worker fails. If a peer dies
        during the check, the collective's `WorkerLostError` propagates (the run loop
        restores and re-joins); the snapshot has already been taken and counted.
        Raises `HostsUpdatedInterrupt` on every rank alike when membership changes, and
        `UnloadableCommit` on every rank alike when this commit is due to be written to the
        checkpoint directory and holds a value a checkpoint cannot hold (see
        `elastic.state.loadable`; rank 0's message names the value), unless the directory
        trusts full pickles.
        """
        step_boundary.boundary()  # whatever the script booked, it booked before its commit
        self.save()
        self._saved_steps = self._steps
        self._commit_count += 1
        ctx = context.current("State.commit")
        if ctx.on_commit is not None:  # the driver saves it (with --backend etcd)
            ctx.on_commit(self._commit_count)
        durable = self._durable
        refused: str | None = None
        if durable is not None and ctx.rank == 0 and durable.due(self._commit_count):
            payload = self._durable_payload()
            report = ctx.on_durable

            def written() -> None:  # on the writer's thread, once the write is over
                self._durable_written()
                if report is not None:
                    report(durable.written, durable.stale)

            if not durable.directory.trust_pickles:
                refused = refusal_of(payload)
            if refused is not None or not durable.offer(self._commit_count, payload, written):
                self._durable_written()  # not taken after all: the snapshot is free again
        self._check_host_updates(refused)

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank if any rank has been told of a newer
        round or has been asked to leave.

        One small allreduce (MAX of [update pending, workers added, leaving]) makes all ranks
        agree, so they raise at the same call even when the driver's notice reached only some
        of them. `skip_sync` is true when no worker is added. Raises the collective's
        `WorkerLostError` if a peer dies.
        """
        step_boundary.boundary()
        self._check_host_updates(None)

    def _check_host_updates(self, refused: str | None) -> None:
        """`check_host_updates()`, whose allreduce also carries whether this rank `refused`
        to write the commit (why, in words): then every rank raises `UnloadableCommit`."""
        ctx = context.current("State.check_host_updates")
        update = ctx.events.pending_update(ctx.round)
        flags = torch.tensor(
            [
                update is not None,
                update is not None and update.added,
                ctx.events.leaving or (update is not None and update.removed),
                refused is not None,
            ],
            dtype=torch.int64,
        )
        pending, added, leaving, any_refused = (bool(v) for v in allreduce(flags, op=Max).tolist())
        if any_refused:
            raise UnloadableCommit(
                f"durable commit {self._commit_count} not written: "
                + (refused or "rank 0, which writes it, found a value a checkpoint cannot hold")
            )
        if pending or leaving:
            self.prepare_to_reform(members_leave=leaving)
            raise HostsUpdatedInterrupt(skip_sync=not added)

    def finish_background(self) -> None:
        """Called by the run loop once the training function has returned, while the
        round's process group still works: finish what the state does in the background
        (`ShardedState`: the replication of its last commit), so that `hvd.shutdown()` or
        the interpreter's exit never tears a group down under it. Never raises for a lost
        peer (the training is over). Nothing to do here."""

    def prepare_to_reform(self, members_leave: bool = True) -> None:
        """Run on every rank, in the round that ends, once all agreed to re-form (at a commit,
        or at a step: `DistributedOptimizer`'s re-form word), while the old group still works:
        subclasses merge what only some ranks know (samples recorded with `record_indices`).
        `members_leave` (the same on every rank): some member of this round is not in the next
        (False: the round only grows). May use collectives (their `WorkerLostError`
        propagates)."""

    @property
    def durable(self) -> DurableWriter | None:
        """The writer of durable commits (None without a checkpoint directory): `written`,
        the newest commit on disk; `stale`, whether the last write failed."""
        return self._durable

    def _durable_payload(self) -> Any:
        """What a durable commit writes: the current snapshot, which the subclass must not
        overwrite until `_durable_written` is called (from the writer's thread)."""
        raise NotImplementedError

    def _durable_written(self) -> None:
        """The durable write of the payload last given is over: its snapshot is free."""

    def _load_durable(self, payload: Any) -> None:
        """Make a durable commit's payload the snapshot and the live state (local)."""
        raise NotImplementedError

    def _durable_misfit(self, payload: Any) -> str | None:
        """Why a loaded checkpoint's payload is no state's payload (then it is passed over
        and the one before it tried); None when it has the shape `_durable_payload` gives:
        a dict whose "objects" and "handlers", where present, are dicts keyed by name."""
        if not isinstance(payload, dict):
            return f"holds a {type(payload).__name__}, not a state's payload (a dict)"
        for part in ("objects", "handlers"):
            value = payload.get(part, {})
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                return f"holds a {part!r} that is not a dict keyed by name"
        return None

    def _holds_unshared(self) -> bool:
        """Whether this rank's state holds what the others do not know at the same commit
        count (a sync must then merge it); subclasses with such state say so."""
        return False

    def _counts_steps(self) -> bool:
        """Whether this state counts the optimizer steps applied to it (`_steps`), so that
        survivors can agree on a live state instead of rolling back (`TorchState` with an
        optimizer). Here: no."""
        return False

    def _drop_step(self) -> None:
        """Forget the step in flight (its gradients) when the live state is kept."""

    def peer_lost(self, err: WorkerLostError) -> None:
        """A peer died (`err`, from a collective): under `--rollback step`, in a state that
        counts its steps, keep the live state for the next round to agree on (`sync`: the
        survivors go on from the newest step one of them holds consistently, or, when none
        does, every one rolls back to its last commit there); otherwise roll back to the last
        commit now. Local."""
        ctx = context.current("State.peer_lost")
        mode = ctx.config.rollback if ctx.config is not None else "step"
        if mode == "commit" or not self._counts_steps():
            log.warning("rank %d: %s; restoring the last commit", ctx.rank, err)
            self._roll_back()
            return
        consistent = step_boundary.at_boundary() and not self._torn
        self._kept = "consistent" if consistent else "inconsistent"
        self._drop_step()
        if consistent:
            log.warning("rank %d: %s; keeping the state after step %d", ctx.rank, err, self._steps)
        else:
            log.warning(
                "rank %d: %s; its state after step %d is not booked yet (a collective between "
                "optimizer.step() and record_batch), so it takes a peer's",
                ctx.rank, err, self._steps,
            )  # fmt: skip

    def _roll_back(self) -> None:
        """Back to the last snapshot, step count included (local)."""
        self.restore()
        self._steps, self._torn, self._kept = self._saved_steps, False, None

    def newest_commit_rank(self) -> tuple[int, int]:
        """Return `(rank, commit_count)`: the lowest rank among those whose snapshot has the
        highest commit counter. A collective (one allreduce); raises its `WorkerLostError` if a
        peer dies."""
        survey = self._survey(needed=True)
        return survey.root, survey.newest

    def _survey(self, needed: bool, durable: int = 0) -> _Survey:
        """One allreduce: every rank's commit count, whether any rank `needed` a sync (or
        holds unshared state), the newest commit count the driver told any rank of, and the
        newest durable commit each rank found (`durable`)."""
        ctx = context.current("State.sync")
        size, rank = ctx.size, ctx.rank
        values = torch.zeros(5 * size + 2, dtype=torch.int64)
        values[rank] = self._commit_count
        values[size + rank] = ctx.job_commit
        values[2 * size + rank] = durable
        values[3 * size + rank] = self._steps
        # what this rank offers to go on from: its step count + 1, when it kept a consistent
        # live state after a lost peer; 0 otherwise
        values[4 * size + rank] = self._steps + 1 if self._kept == "consistent" else 0
        values[5 * size] = int(needed or self._holds_unshared())
        values[5 * size + 1] = int(self._kept is not None)
        values = allreduce(values, op=Sum)
        counts, found = values[:size], values[2 * size : 3 * size]
        offers = values[4 * size : 5 * size]
        newest, job_commit = int(counts.max()), int(values[size : 2 * size].max())
        best = int(offers.max())
        asked = bool(values[5 * size])
        return _Survey(
            root=int((counts == newest).nonzero()[0]),
            newest=newest,
            job_commit=job_commit,
            needed=asked or int(counts.min()) != newest or newest < job_commit,
            durable=int(found.max()),
            durable_rank=int((found == found.max()).nonzero()[0]),
            steps=tuple(int(v) for v in values[3 * size : 4 * size]),
            kept=bool(values[5 * size + 1]),
            live_root=int((offers == best).nonzero()[0]) if best > 0 else None,
            live_needed=asked or int(offers.min()) != best or int(counts.min()) != newest,
        )

    def _newest_durable(self) -> int:
        """The newest durable commit's count where this rank's state is fresh (it never
        committed nor synced) and has a checkpoint directory; else 0 (nothing looked up)."""
        if self._durable is None or self._commit_count > 0:
            return 0
        try:
            commits = self._durable.directory.commits()
        except Exception as err:  # an unreachable store, a directory refused: say so, go on
            log.error("checkpoints in %s: none loaded, %s", self._durable.directory.url, err)
            return 0
        return commits[0] if commits else 0

    def _resume_durable(self, survey: _Survey) -> _Survey:
        """No live rank holds a commit as new as the newest durable one: the rank that found
        it loads the newest one that verifies, and the ranks survey again."""
        ctx = context.current("State.sync")
        if ctx.rank == survey.durable_rank and self._durable is not None:
            checkpoint = self._durable.directory.newest(self._durable_misfit)
            if checkpoint is not None and checkpoint.commit > self._commit_count:
                self._load_durable(checkpoint.payload)
                self._commit_count = checkpoint.commit
                log.warning(
                    "resuming from durable commit %d in %s: no live worker holds a newer one",
                    checkpoint.commit,
                    self._durable.directory.url,
                )
        return self._survey(True)

    def sync(self) -> None:
        """Make every rank's state equal to that of the rank holding the newest commit, and
        make that the snapshot on every rank (with the same commit counter).

        The source is chosen collectively (`newest_commit_rank()`), so a freshly joined
        worker (counter 0) is never the source while some rank has committed. If a peer dies
        meanwhile, the collective's `WorkerLostError` propagates (the run loop restores and
        re-joins) and this rank's state may be partly overwritten; its snapshot is
        untouched, so `restore()` recovers it.

        When no rank holds the newest commit the job had reached (the workers that held it
        are gone), rank 0 says so in one log line and training goes on from the newest
        commit that survives; the counter then continues from the job's newest, so it never
        goes backwards.
        """
        self.sync_if_needed(True)

    def sync_if_needed(self, needed: bool) -> None:
        """`sync()` if any rank passes `needed=True` or holds state the others do not know
        (samples recorded with `record_indices`), or the ranks' commit counts differ, or none
        holds the job's newest commit; else nothing beyond one small allreduce.

        A collective: every rank of the round calls it, each with its own view. Ranks at the
        same commit count hold the same state (every commit is taken at the same step on
        every rank, and a sync makes the counts equal), so the run loop passes False after a
        membership change that, as this rank saw it, added nobody, and after a restore."""
        survey = self._survey(needed, self._newest_durable())
        if survey.kept:
            if survey.live_root is not None:
                self._go_on_live(survey)
                return
            survey = self._roll_back_kept(needed)
        if survey.durable > survey.newest:
            survey = self._resume_durable(survey)
        if not survey.needed:
            return
        ctx = context.current("State.sync")
        self._sync_from_root(survey.root, survey.steps[survey.root])
        self._commit_count = max(survey.newest, survey.job_commit)
        if survey.newest < survey.job_commit and ctx.rank == 0:
            start = f"commit {survey.newest}" if survey.newest else "the initial state"
            log.warning(
                "training state lost: no worker of the job holds its newest commit (%d), the "
                "workers that held it are gone; going on from %s",
                survey.job_commit,
                start,
            )
        self.save()
        self._saved_steps = self._steps
        if ctx.on_commit is not None:
            ctx.on_commit(self._commit_count)

    def _sync_from_root(self, root: int, steps: int) -> None:
        """`sync_from(root)`, `root`'s step count with it; a rank cut off meanwhile has a
        torn live state (`peer_lost` then offers none)."""
        ctx = context.current("State.sync")
        self._torn = ctx.rank != root
        self.sync_from(root)
        self._steps, self._torn = steps, False

    def _go_on_live(self, survey: _Survey) -> None:
        """After a lost peer, some survivor kept a consistent live state: every rank goes on
        from the one with the most steps (`survey.live_root`), taking it where the live
        states differ, and that state becomes a new commit. Nothing is rolled back."""
        ctx = context.current("State.sync")
        root = survey.live_root
        assert root is not None
        steps = survey.steps[root]
        self._kept = None
        if not survey.live_needed:
            return
        if ctx.rank == 0:
            log.warning(
                "going on from rank %d's state after step %d, nothing rolled back", root, steps
            )
        self._sync_from_root(root, steps)
        self._commit_count = max(survey.newest, survey.job_commit) + 1
        self.save()
        self._saved_steps = self._steps
        if ctx.on_commit is not None:
            ctx.on_commit(self._commit_count)

    def _roll_back_kept(self, needed: bool) -> _Survey:
        """After a lost peer, no survivor holds a consistent live state: those that kept
        theirs roll back to their last commit, as with `--rollback commit`, and the ranks
        survey again."""
        ctx = context.current("State.sync")
        if self._kept is not None:
            self._roll_back()
        if ctx.rank == 0:
            log.warning(
                "no survivor holds a consistent state after its last step: rolling back to "
                "the last commit"
            )
        return self._survey(needed, self._newest_durable())

    def save(self) -> None:
        """Snapshot the state to host memory (local; no collective)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Roll back to the last snapshot, undoing every change since (local)."""
        raise NotImplementedError

    def sync_from(self, root_rank: int) -> None:
        """Overwrite this rank's live state with `root_rank`'s (a collective; every rank calls
        it with the same root). Raises the collective's `WorkerLostError` if a peer dies."""
        raise NotImplementedError


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments and exposed as attributes.

    Snapshots are deep copies in host memory, so in-place changes to a list or dict after a
    commit are undone by `restore()`. `sync` pickles the values (`broadcast_object`).
    Only the names given here are tracked; each must be picklable and deep-copyable, and, with
    a checkpoint directory, a value a checkpoint can hold (tensors and plain values: see
    `elastic.state.loadable`) unless the directory trusts full pickles.
    """

    def __init__(self, checkpoint_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(checkpoint_dir)
        self._check_names(kwargs)
        self._names = list(kwargs)
        self._saved: dict[str, Any] = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        ObjectState.save(self)

    @classmethod
    def _check_names(cls, names: Iterable[str]) -> None:
        for name in names:
            if name.startswith("_") or hasattr(cls, name):
                raise ValueError(f"{cls.__name__}: {name!r} would hide an attribute of the state")

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def _durable_payload(self) -> Any:
        return {"objects": self._saved}  # a new copy at every save: never overwritten

    def _load_durable(self, payload: Any) -> None:
        saved = payload.get("objects", {})
        if missing := [name for name in self._names if name not in saved]:
            log.warning("the durable commit holds no %s: kept as they are", ", ".join(missing))
        self._saved = {name: saved.get(name, getattr(self, name)) for name in self._names}
        ObjectState.restore(self)

    def sync_from(self, root_rank: int) -> None:
        if not self._names:
            return
        for name, value in broadcast_object(self._values(), root_rank).items():
            setattr(self, name, value)
