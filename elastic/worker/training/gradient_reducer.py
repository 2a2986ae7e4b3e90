"""Reducing `DistributedOptimizer`'s gradients over the ranks while backward runs.

Each parameter's post-accumulate-grad hook marks it ready, and a bucket of parameters (fused
into one reused flat buffer, in reverse registration order, up to `fusion_threshold_bytes`)
is allreduced asynchronously once all of its gradients are ready. Buckets are launched
strictly in bucket order, so every rank issues the same collectives in the same order.
`synchronize()` waits for them and writes the reduced gradients back. The last bucket carries
two more elements, summed by the same allreduce: how many sparse gradients the ranks have
(`sparse_gradients.py`) and whether the round ends at the next step (`_ReformWord`): a member
is leaving, or the driver announced a newer round (a worker joins, a host is removed).

A failure (a peer lost, the round broken) abandons the step's gradients: the next backward
starts a new one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker import context
from elastic.worker.collectives.checks import (
    WIDTH,
    Call,
    Kind,
    collective_checks,
    raise_disagreement,
)
from elastic.worker.collectives.compression import Compressor
from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.collectives.reduce_ops import Average, ReduceOp
from elastic.worker.context import current
from elastic.worker.torch_versions import all_gather_single
from elastic.worker.training.sparse_gradients import SparseGradients, SparseWord

__all__ = ["GradientReducer"]


class _Bucket:
    """Parameters of one dtype and device whose gradients are reduced as one flat buffer; the
    last bucket's buffer carries two more elements: the count of sparse gradients
    (`SparseWord`) and, last, the re-form word (`_ReformWord`)."""

    __slots__ = ("params", "indices", "numels", "words", "flat", "views", "remaining", "pending")

    def __init__(self, params: list[torch.nn.Parameter], indices: list[int]) -> None:
        self.params = params
        self.indices = indices
        self.numels = [p.numel() for p in params]
        self.words = 0  # elements after the gradients: 2 in the bucket launched last
        self.flat: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []
        self.remaining = len(params)
        # (work, tensor being reduced, compression context) while launched.
        self.pending: tuple[dist.Work | None, torch.Tensor, Any] | None = None

    def buffer(self) -> torch.Tensor:
        """The flat buffer, allocated on first use and reused every step."""
        if self.flat is None:
            first = self.params[0]
            total = sum(self.numels)
            self.flat = torch.empty(total + self.words, dtype=first.dtype, device=first.device)
            pieces = self.flat.narrow(0, 0, total).split(self.numels)
            self.views = [v.view_as(p) for v, p in zip(pieces, self.params, strict=True)]
        return self.flat


class _ReformWord:
    """Whether the round ends at the next step, agreed by every rank at the same step for free:
    each rank puts 1 (it is leaving, or the driver told it of a newer round) or 0 in one extra
    element of the step's last gradient allreduce, and every rank reads the same sum. So a
    worker that joins (or a host that goes) waits one step for the others, not until their
    next commit, however far apart commits are. `take(round)`, at the start of the next
    `step()`, says what the last completed step's allreduce of that same round agreed
    (waiting for it on a GPU), and forgets it. A word of an earlier round is never acted on:
    the round ended otherwise (at a commit, on a failure), and the new round's members did
    not all hear it."""

    def __init__(self) -> None:
        self._agreed = False
        self._round = 0  # the round whose allreduce the word came from
        self._host: torch.Tensor | None = None  # pinned: the GPU's copy lands here
        self._copied: torch.cuda.Event | None = None

    def read(self, reduced: torch.Tensor, round_: int) -> None:
        """`reduced`: the word's element once round `round_`'s allreduce has completed."""
        self._round = round_
        if reduced.device.type != "cuda":
            self._agreed, self._copied = bool(reduced.item() > 0), None
            return
        if self._host is None or self._host.dtype != reduced.dtype:
            self._host = torch.empty(1, dtype=reduced.dtype, pin_memory=True)
        self._host.copy_(reduced.reshape(1), non_blocking=True)  # no stall of this step
        self._copied = torch.cuda.Event()
        self._copied.record()

    def take(self, round_: int) -> bool:
        if self._copied is not None:
            assert self._host is not None
            self._copied.synchronize()  # long done: the next step's backward came after it
            self._agreed, self._copied = bool(self._host.item() > 0), None
        agreed, self._agreed = self._agreed and self._round == round_, False
        return agreed


def _make_buckets(params: list[torch.nn.Parameter], threshold: int) -> list[_Bucket]:
    """Group parameters in reverse order into buckets of one (device, dtype), each at most
    `threshold` bytes unless a single parameter is larger."""
    buckets: list[_Bucket] = []
    members: list[int] = []
    size = 0
    key: tuple[torch.device, torch.dtype] | None = None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        p_key = (p.device, p.dtype)
        if members and (p_key != key or size + nbytes > threshold):
            buckets.append(_Bucket([params[j] for j in members], members))
            members, size = [], 0
        members.append(i)
        size += nbytes
        key = p_key
    if members:
        buckets.append(_Bucket([params[j] for j in members], members))
    return buckets


class GradientReducer:
    """Reduces the gradients of `params` over the ranks, one fused bucket at a time."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: ReduceOp,
        gradient_predivide_factor: float,
        fusion_threshold_bytes: int,
        sparse_as_dense: bool = False,
    ) -> None:
        self.compression = compression
        self.passes = backward_passes_per_step
        self.op = op
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.buckets = _make_buckets(params, fusion_threshold_bytes)
        if self.buckets:
            self.buckets[-1].words = 2
        self.word = _ReformWord()
        self.sparse = SparseGradients(params, average=op == Average)
        self.sparse_word = SparseWord()
        self.counts = [0] * len(params)
        self.next_launch = 0
        # Its optimizer's place among the process's (the same on every rank), and its step's
        # check row exchange while in flight: hvd.join's ranks read it.
        self.index = -1
        self.joined = False  # stepping from inside hvd.join(): no row of its own
        self.step_rows: tuple[dist.Work, torch.Tensor] | None = None
        self.hooks = []
        for b, bucket in enumerate(self.buckets):
            for i, p in zip(bucket.indices, bucket.params, strict=True):
                hook = functools.partial(self._on_grad_ready, b, i)
                self.hooks.append(p.register_post_accumulate_grad_hook(hook))

    def in_flight(self) -> bool:
        """True once a gradient of this step is ready (its allreduce may have started)."""
        return self.next_launch > 0 or any(b.remaining < len(b.params) for b in self.buckets)

    def _on_grad_ready(self, bucket_index: int, param_index: int, _param: torch.Tensor) -> None:
        count = self.counts[param_index] + 1
        if count > self.passes:
            raise RuntimeError(
                "Gradients were computed more than backward_passes_per_step times before "
                "optimizer.step() or synchronize(); increase backward_passes_per_step to "
                "accumulate gradients locally"
            )
        self.counts[param_index] = count
        if count == self.passes:
            bucket = self.buckets[bucket_index]
            bucket.remaining -= 1
            if bucket.remaining == 0 and bucket_index == self.next_launch:
                self._launch_until(lambda b: b.remaining == 0)

    def _launch_until(self, ready: Callable[[_Bucket], bool]) -> None:
        """Launch buckets in order from the next unlaunched one while `ready` holds."""
        try:
            while self.next_launch < len(self.buckets):
                bucket = self.buckets[self.next_launch]
                if not ready(bucket):
                    return
                self._launch(bucket)
                self.next_launch += 1
        except BaseException:
            self.abandon()
            raise

    def _step_row(self) -> list[int]:
        described = [
            (b.params[0].dtype, torch.Size([sum(b.numels) + b.words])) for b in self.buckets
        ]
        cuda = bool(self.buckets) and self.buckets[0].params[0].is_cuda
        call = Call(Kind.STEP, described, op=self.index, cuda=cuda)
        return call.row()

    @torch.no_grad()
    def _launch(self, bucket: _Bucket) -> None:
        ctx = current("DistributedOptimizer")
        if self.next_launch == 0:  # one collective per step, as the driver counts them
            context.process_wide().progress.issued("gradients")
        if self.next_launch == 0 and not self.joined and collective_checks():
            # One small exchange per step, before the first bucket, so that a rank inside
            # hvd.join() knows a step comes; it overlaps the backward pass.
            mine = torch.tensor(self._step_row(), dtype=torch.int64)
            rows = torch.empty(ctx.size * WIDTH, dtype=torch.int64)
            work = all_gather_single(rows, mine, group=ctx.group, async_op=True)
            self.step_rows = (work, rows)
        flat = bucket.buffer()
        grads = [p.grad for p in bucket.params]
        if all(g is not None and not g.is_sparse for g in grads):
            torch._foreach_copy_(bucket.views, grads)  # one fused copy, no per-tensor ops
        else:
            for index, view, g in zip(bucket.indices, bucket.views, grads, strict=True):
                if g is None:
                    view.zero_()  # a gradient this rank never computed counts as zeros
                elif g.is_sparse and not self.sparse_as_dense:
                    view.zero_()  # allgathered after the step's allreduces
                    self.sparse.take(index, g)
                else:
                    view.copy_(g.to_dense() if g.is_sparse else g)
        if self.prescale != 1.0:
            flat.mul_(self.prescale)
        if bucket.words:
            flat[-2] = float(self.sparse.count())
            reform = ctx.events.leaving or ctx.events.pending_update(ctx.round) is not None
            flat[-1] = 1.0 if reform else 0.0
        buf, cctx = self.compression.compress(flat)
        if not buf.is_contiguous():
            buf = buf.contiguous()
        work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=ctx.group, async_op=True)
        bucket.pending = (work, buf, cctx)

    @torch.no_grad()
    def synchronize(self, where: Scope, round_: int) -> None:
        """Launch the buckets not yet launched, wait for all, write reduced gradients back
        (then reduce the sparse ones, if a rank has any); `where`: every rank of the current
        round, `round_`: its number.

        On error the step's reduction is abandoned (see `abandon`) and the error re-raised.
        """
        self._launch_until(lambda b: True)
        size = where.size
        try:
            if self.step_rows is not None:
                work, rows = self.step_rows
                wait(work)
                raise_disagreement(rows.view(size, WIDTH).tolist(), range(size))
            factor = self.postscale / size if self.op == Average else self.postscale
            for bucket in self.buckets:
                self._finish(bucket, factor, round_)
            if self.sparse_word.take():
                self.sparse.reduce(where)
        except BaseException:
            self.abandon()
            raise
        self._reset_step()

    def _finish(self, bucket: _Bucket, factor: float, round_: int) -> None:
        """Wait for `bucket`'s allreduce, then write `factor * result` into the gradients."""
        assert bucket.pending is not None
        work, buf, cctx = bucket.pending
        if work is not None:
            wait(work)
        out = self.compression.decompress(buf, cctx)
        if bucket.words:
            self.word.read(out[-1:], round_)
            self.sparse_word.read(out[-2:-1])
            out = out.narrow(0, 0, out.numel() - bucket.words)
        if bucket.flat is not None and out.data_ptr() == bucket.flat.data_ptr():
            views = bucket.views
        else:
            pieces = zip(out.split(bucket.numels), bucket.params, strict=True)
            views = [piece.view_as(p) for piece, p in pieces]
        grads = [p.grad for p in bucket.params]
        if all(g is not None and not g.is_sparse for g in grads):
            if factor != 1.0:
                out.mul_(factor)  # one pass over the flat buffer, not one per gradient
            torch._foreach_copy_(grads, views)
            return
        for p, view in zip(bucket.params, views, strict=True):
            if p.grad is not None and p.grad.is_sparse and self.sparse_as_dense:
                p.grad = view.mul(factor).to_sparse(p.grad.sparse_dim())  # as the optimizer expects
            elif p.grad is None or p.grad.is_sparse:
                p.grad = view.mul(factor) if factor != 1.0 else view.clone()
            elif factor != 1.0:
                torch.mul(view, factor, out=p.grad)
            else:
                p.grad.copy_(view)

    def _reset_step(self) -> None:
        counts = self.counts
        for i in range(len(counts)):
            counts[i] = 0
        for bucket in self.buckets:
            bucket.remaining = len(bucket.params)
            bucket.pending = None
        self.next_launch = 0
        self.step_rows = None
        self.sparse.reset()

    def abandon(self) -> None:
        """Forget the current step's reduction after a failure; the next backward starts anew.

        The flat buffers are dropped too: an abandoned collective may still write to them.
        """
        for bucket in self.buckets:
            bucket.flat = None
            bucket.views = []
        self._reset_step()

    def remove_hooks(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
