"""Durable checkpoints of a `ShardedState`: the fallback when more hosts are lost at once than
its replicas cover, and where a requeued job starts from.

Writing (`DurableCheckpoints.at_commit`, on every rank at a commit): when a checkpoint is
due (every `every` commits, or the first commit `interval` seconds after the last one) and
none is in flight on any rank, the ranks agree in one small all-reduce, copy their shards
(`get_state_dict`: DTensor shards of the model and optimizer) and their plain values and
samplers into host memory, and hand them to `torch.distributed.checkpoint.async_save`,
which writes them from a background thread over a Gloo group of the round's own: the step
waits for the copy, not for the disk. Rank 0 writes the checkpoint's marker once DCP's save
returned, which is after every rank's files are written (`checkpoint_files`), then deletes
all but the newest `keep`. A failed write is said in one line; training goes on. A write in
flight when a peer dies is abandoned with its round: it never gets a marker, unless it had
finished everywhere.

Loading (`DurableCheckpoints.resume`, a collective of the new round): rank 0 picks the
newest finished checkpoint that passes the trust checks (`checkpoint_files`), every rank
loads its part of it into the model and optimizer `build` made for the new mesh, at any
world size (DCP re-shards), and every rank gets every old rank's plain values (samplers
are merged over them). A checkpoint DCP fails to load is passed over for the one before.

Jobs without a checkpoint directory pay nothing: no object, no collective.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from elastic.protocol.env import CheckpointSettings
from elastic.state.loadable import UnloadableCommit, refusal_of
from elastic.state.sharded.checkpoint_files import Marker, ShardedCheckpointDir, choose_newest
from elastic.worker import context
from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.objects import allgather_object
from elastic.worker.collectives.reduce_ops import Max
from elastic.worker.context import WorkerContext
from elastic.worker.group.process_group import create_round_subgroup

__all__ = ["DurableCheckpoints", "Resumed", "optimizer_step", "resume_line"]

log = logging.getLogger("elastic")

RESUME_WAIT = 10.0  # seconds rank 0 waits for its own write in flight before choosing


@dataclass(frozen=True)
class Resumed:
    """The durable checkpoint a re-form went on from, loaded into the model and optimizer:
    its commit count, the round and number of ranks that wrote it, the optimizer's step count
    then (None where the optimizer keeps none), and every old rank's plain values and
    samplers (`{"objects": ..., "samplers": ...}`, in old rank order)."""

    commit: int
    round: int
    world: int
    step: int | None
    plain: list[Any]
    url: str


def optimizer_step(optimizer: torch.optim.Optimizer) -> int | None:
    """The optimizer's step count (its first parameter's `step`, as Adam and most others
    keep it), None where it keeps none."""
    for values in optimizer.state.values():
        step = values.get("step") if isinstance(values, dict) else None
        if step is not None:
            if isinstance(step, DTensor):
                step = step.to_local()
            if isinstance(step, torch.Tensor):
                return int(step.item())
            return int(step)
    return None


def resume_line(
    resumed: Resumed, replicas: int, lost: bool, live_step: int | None, newest_commit: int
) -> str:
    """The one line a re-form that went on from `resumed` says: why (`lost`: more hosts were
    lost than the `replicas` cover; else the job starts from its checkpoint directory), which
    checkpoint, and how much work was lost since (steps where the optimizer counts them,
    else commits)."""
    which = f"commit {resumed.commit}"
    if resumed.step is not None:
        which = f"step {resumed.step} ({which})"
    where = f"the durable checkpoint of {which} in {resumed.url}"
    if not lost:
        return f"ShardedState: resuming from {where}"
    copies = "replica covers" if replicas == 1 else "replicas cover"
    if resumed.step is not None and live_step is not None:
        gone = f"{max(0, live_step - resumed.step)} steps lost"
    else:
        gone = f"{max(0, newest_commit - resumed.commit)} commits lost"
    return f"more hosts lost than the {replicas} {copies}: resuming from {where}, {gone}"


class DurableCheckpoints:
    """Writes a `ShardedState`'s checkpoints at its commits and loads the newest at a re-form
    (see the module's docstring). `every`, `interval` (seconds, None: no such bound) and
    `keep` as for `--checkpoint-every`, `--checkpoint-interval`, `--checkpoint-keep`.

    `written` is the newest commit whose checkpoint this rank saw finished, `error` the last
    write's failure until one succeeds."""

    def __init__(
        self,
        directory: ShardedCheckpointDir,
        every: int = 1,
        interval: float | None = None,
        keep: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every < 1 or keep < 1 or (interval is not None and interval <= 0):
            raise ValueError(
                f"durable checkpoints: every ({every}) and keep ({keep}) must be at least 1, "
                f"interval ({interval}) positive"
            )
        self.directory = directory
        self._every, self._interval, self._keep, self._clock = every, interval, keep, clock
        self._last: tuple[int, float] | None = None  # (commit, when) of the last one started
        self._group: Any = None
        self._group_round: tuple[int, int] | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.written = 0
        self.error: str | None = None

    @classmethod
    def from_settings(cls, checkpoint_dir: str | None = None) -> DurableCheckpoints | None:
        """The checkpoints of a state: to `checkpoint_dir` when given, else to the launcher's
        `--checkpoint-dir`; cadence, number kept and trust from the launcher's settings either
        way. None (nothing to pay) when no directory is named."""
        settings = CheckpointSettings.from_env()
        url = checkpoint_dir or settings.directory
        if not url:
            return None
        return cls(
            ShardedCheckpointDir(url, trust_pickles=settings.trust_pickles),
            every=settings.every,
            interval=settings.interval or None,
            keep=settings.keep,
        )

    # --- writing ----------------------------------------------------------------------------

    def _due(self, commit: int) -> bool:
        if self._last is None:
            return True
        last_commit, when = self._last
        if commit - last_commit >= self._every:
            return True
        return self._interval is not None and self._clock() - when >= self._interval

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for this rank's write in flight, if any; True if none is left."""
        return self._idle.wait(timeout)

    def at_commit(
        self,
        ctx: WorkerContext,
        commit: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plain: dict[str, Any],
    ) -> bool:
        """At commit `commit` (every rank, a collective: one small all-reduce): start writing
        a checkpoint if one is due and none is in flight on any rank; True if one started.
        Raises `UnloadableCommit` on every rank alike when a plain value is not one a
        checkpoint can hold (unless full pickles are trusted), the all-reduce's
        `WorkerLostError` when a peer dies."""
        if self._group_round != (ctx.round, ctx.formation):
            self._idle = threading.Event()  # the last round's write, if any, is abandoned
            self._idle.set()
        due = self._due(commit)
        refused = None
        if due and not self.directory.trust_pickles:
            refused = refusal_of({"objects": plain["objects"]})
        flags = torch.tensor([due, not self._idle.is_set(), refused is not None], dtype=torch.int64)
        due_any, busy_any, refused_any = (bool(v) for v in allreduce(flags, op=Max).tolist())
        if refused_any:
            raise UnloadableCommit(
                f"durable checkpoint of commit {commit} not written: "
                + (refused or "another rank found a value a checkpoint cannot hold")
            )
        if not due_any or busy_any:
            return False
        self._last = (commit, self._clock())
        self._start(ctx, commit, model, optimizer, plain)
        return True

    def _round_group(self, ctx: WorkerContext) -> Any:
        """The Gloo group this round's writes run their collectives on (a collective the
        first time in a round)."""
        if self._group_round != (ctx.round, ctx.formation):
            round_ = ctx.round
            self._group = create_round_subgroup(
                timedelta(seconds=ctx.timeout), lambda: ctx.events.broken(round_)
            )
            context.bury(self._group)  # a write may still wait on a dead peer at round's end
            self._group_round = (ctx.round, ctx.formation)
        return self._group

    def _start(
        self,
        ctx: WorkerContext,
        commit: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plain: dict[str, Any],
    ) -> None:
        group = self._round_group(ctx)
        model_state, optim_state = get_state_dict(model, optimizer)
        mine = _to_bytes_tensor(plain)
        sizes = allgather_object(mine.numel())
        state = {"model": model_state, "optim": optim_state, "plain": {str(ctx.rank): mine}}
        marker = Marker(commit, ctx.round, ctx.size, optimizer_step(optimizer), {}, "", sizes)
        directory = self.directory
        writer = directory.writer(marker.name)
        idle = self._idle = threading.Event()
        report = ctx.on_durable if ctx.rank == 0 else None
        future = dcp.async_save(state, storage_writer=writer, process_group=group)
        future.add_done_callback(lambda done: self._finished(done, marker, ctx.rank, idle, report))

    def _finished(
        self,
        future: Any,
        marker: Marker,
        rank: int,
        idle: threading.Event,
        report: Callable[[int, bool], None] | None,
    ) -> None:
        """On DCP's thread, once this rank's part of the save is over: rank 0 writes the
        marker (every rank's files are written by then) and prunes."""
        try:
            future.result()
            if rank == 0:
                self.directory.finish(marker)
            self.written, self.error = marker.commit, None
            if rank == 0:
                log.info("durable checkpoint of commit %d written to %s", marker.commit,
                         self.directory.url)  # fmt: skip
                self._prune()
        except Exception as err:  # a full disk, a permission, a peer gone in the write
            message = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            if message != self.error:
                log.error(
                    "durable checkpoint of commit %d to %s failed (%s); training goes on, "
                    "the newest written is %s",
                    marker.commit, self.directory.url, message, self.written or "none",
                )  # fmt: skip
            self.error = message
        finally:
            idle.set()
            if report is not None:
                report(self.written, self.error is not None)

    def _prune(self) -> None:
        try:
            self.directory.prune(self._keep)
        except Exception as err:  # old checkpoints stay: more disk used, nothing lost
            log.warning("old checkpoints in %s not deleted: %s", self.directory.url, err)

    # --- loading ----------------------------------------------------------------------------

    def resume(
        self,
        ctx: WorkerContext,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        live_step: int | None,
    ) -> tuple[Resumed | None, int | None, bool]:
        """Load the newest usable checkpoint into `model` and `optimizer` (built for this
        round's mesh) on every rank: a collective. Returns it (None when there is none, or
        none loads: each one passed over is said in one line by rank 0), the highest
        `live_step` of the ranks (the optimizer step the job had reached), and whether a
        load was tried (then, when none succeeded, `model` and `optimizer` may be partly
        overwritten). A peer's death raises the collective's `WorkerLostError`."""
        refused: set[str] = set()
        while True:
            marker = self._pick(refused) if ctx.rank == 0 else None
            shared = allgather_object((marker, live_step))
            marker = shared[0][0]
            steps = [step for _, step in shared if step is not None]
            reached = max(steps) if steps else None
            if marker is None:
                return None, reached, bool(refused)
            try:
                plain = self._load(ctx, marker, model, optimizer)
                failed = None
            except Exception as err:  # DCP raises on every rank alike; the rest is agreed below
                failed = f"{type(err).__name__}: {str(err).strip()[:300]}"
            problems = [p for p in allgather_object(failed) if p is not None]
            if not problems:
                resumed = Resumed(
                    marker.commit, marker.round, marker.world, marker.step, plain,
                    self.directory.url,
                )  # fmt: skip
                return resumed, reached, True
            if ctx.rank == 0:
                log.warning("checkpoint %s in %s: not used, %s", marker.name, self.directory.url,
                            problems[0])  # fmt: skip
            refused.add(f"{marker.name}.json")

    def _pick(self, refused: set[str]) -> Marker | None:
        """Rank 0: the newest checkpoint that verifies, not among `refused`, once its own
        write in flight is over (within `RESUME_WAIT` seconds: every rank may have written
        its files, only the marker missing)."""
        if not self._idle.wait(RESUME_WAIT):
            log.warning("the durable checkpoint in flight did not end within %g s: not waited "
                        "for", RESUME_WAIT)  # fmt: skip
        directory = self.directory
        try:
            names = [n for n in directory.names() if n not in refused]
        except FileNotFoundError:
            return None
        except Exception as err:  # an unreachable store, a directory refused
            log.error("checkpoints in %s: none loaded, %s", directory.url, err)
            return None
        marker, passed = choose_newest(names, directory.verify)
        for line in passed:
            log.warning("checkpoint in %s: not used, %s", directory.url, line)
        return marker

    def _load(
        self,
        ctx: WorkerContext,
        marker: Marker,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> list[Any]:
        """DCP's load of `marker`'s checkpoint into `model` and `optimizer`; every old rank's
        plain values."""
        model_state, optim_state = get_state_dict(model, optimizer)
        sizes = enumerate(marker.plain_bytes)
        plain = {str(k): torch.empty(n, dtype=torch.uint8) for k, n in sizes}
        state = {"model": model_state, "optim": optim_state, "plain": plain}
        directory = self.directory
        dcp.load(
            state,
            storage_reader=directory.reader(marker),
            planner=directory.planner(),
            process_group=ctx.group,
        )
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        weights_only = not directory.trust_pickles
        return [
            torch.load(io.BytesIO(plain[str(k)].numpy().tobytes()), weights_only=weights_only)
            for k in range(marker.world)
        ]


def _to_bytes_tensor(value: Any) -> torch.Tensor:
    """`value` as `torch.save` writes it, in a uint8 tensor (DCP keeps tensors as they are)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
