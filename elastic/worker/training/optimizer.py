"""`DistributedOptimizer` and the broadcasts that make every rank start from the same state.

`DistributedOptimizer` averages (or sums) gradients over all ranks while backward runs: each
parameter's post-accumulate-grad hook marks it ready, and a bucket of parameters (fused into
one reused flat buffer, in reverse registration order, up to `fusion_threshold_bytes`) is
allreduced asynchronously once all of its gradients are ready. Buckets are launched strictly in
bucket order, so every rank issues the same collectives in the same order. `step()` waits for
them and writes the reduced gradients back before updating the parameters. Sparse gradients
are reduced as Horovod reduces them (`sparse_gradients.py`).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
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
from elastic.worker.collectives.compression import Compression, Compressor
from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.collectives.reduce_ops import Average, ReduceOp, Sum, resolve_op
from elastic.worker.context import current
from elastic.worker.errors import HostsUpdatedInterrupt
from elastic.worker.torch_versions import all_gather_single
from elastic.worker.training.sparse_gradients import SparseGradients, SparseWord

__all__ = ["DistributedOptimizer"]

_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024


class _Bucket:
    """Parameters of one dtype and device whose gradients are reduced as one flat buffer; the
    last bucket's buffer carries two more elements: the count of sparse gradients
    (`SparseWord`) and, last, the leave word (`_LeaveWord`)."""

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


class _LeaveWord:
    """Whether a member is leaving, agreed by every rank at the same step for free: each rank
    puts 1 (leaving) or 0 in one extra element of the step's last gradient allreduce, and
    every rank reads the same sum. `take(round)`, at the start of the next `step()`, says what
    the last completed step's allreduce of that same round agreed (waiting for it on a GPU),
    and forgets it. A word of an earlier round is never acted on: the round ended otherwise
    (at a commit, on a failure), and the new round's members did not all hear it."""

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


class _GradientReducer:
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
        self.word = _LeaveWord()
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
        """True once a gradient of this round is ready (its allreduce may have started)."""
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
            flat[-1] = 1.0 if ctx.events.leaving else 0.0
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

        On error the pending round is abandoned (see `abandon`) and the error re-raised.
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
        self._reset_round()

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

    def _reset_round(self) -> None:
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
        """Forget the current round after a failure; the next backward starts a new one.

        The flat buffers are dropped too: an abandoned collective may still write to them.
        """
        for bucket in self.buckets:
            bucket.flat = None
            bucket.views = []
        self._reset_round()

    def remove_hooks(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []


class _DistributedOptimizer(torch.optim.Optimizer):
    """Placed before the wrapped optimizer's class in a dynamically created subclass."""

    _reducer: _GradientReducer
    _should_synchronize: bool
    _synchronized: bool

    def synchronize(self) -> None:
        """Wait for all gradient allreduces of this step and write the results to `.grad`.

        Parameters whose gradient this rank never computed contribute zeros and receive the
        reduced gradient. Raises `RuntimeError` if a peer dies (the elastic runtime turns that
        into `WorkerLostError`); the pending round is then dropped so that the step can be
        retried after the job re-forms.
        """
        ctx = current("DistributedOptimizer.synchronize")
        where = Scope(group=ctx.group, members=tuple(range(ctx.size)), rank=ctx.rank)
        self._reducer.synchronize(where, ctx.epoch)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Make `step()` skip its `synchronize()`, after an explicit one (e.g. to clip)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Synchronize the gradients (unless inside `skip_synchronize()`), then update.

        When the last step's allreduce agreed that a member is leaving (it got SIGTERM or a
        preemption notice), every rank raises `HostsUpdatedInterrupt` here instead, at the
        same step, before this step changes anything: the leaver goes, the others re-form
        and go on from the state after the last step, with nothing rolled back."""
        if self._reducer.word.take(current("DistributedOptimizer.step").epoch):
            self._reducer.abandon()  # this step's gradients: it never happened
            self._synchronized = False
            raise HostsUpdatedInterrupt(skip_sync=True, at_step=True)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): the gradients are reduced a second time",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        result = super().step(closure)
        context.process_wide().progress.stepped()
        return result

    @torch.no_grad()
    def step_joined(self) -> None:
        """Take part in the others' step from inside `hvd.join()`: this rank's gradients
        count as zeros, and it applies the same reduced gradients, so its parameters stay
        equal to the others'."""
        reducer = self._reducer
        for bucket in reducer.buckets:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                else:
                    p.grad.zero_()
        reducer.joined = True
        try:
            self.synchronize()
        finally:
            reducer.joined = False
        self._synchronized = False
        super().step()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: reduce gradients every `passes` backward passes from now on. Raises
        `ValueError` for fewer than 1, `RuntimeError` while gradients are being reduced."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        if self._reducer.in_flight():
            raise RuntimeError(
                "set_backward_passes_per_step() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize()"
            )
        self._reducer.passes = self.backward_passes_per_step = passes

    def wrapped_step(self, closure: Callable[[], float] | None = None) -> Any:
        """The wrapped optimizer's own step: no reduction over the ranks, nothing counted
        (`broadcast_optimizer_state` initializes a new optimizer's state with it)."""
        return super().step(closure)

    # The wrapped class's step already runs torch's step hooks; keep torch from wrapping ours.
    step.hooked = True  # type: ignore[attr-defined]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; raises `RuntimeError` while gradient allreduces are in flight."""
        if self._reducer.in_flight():
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); this races with the "
                "gradients' allreduce"
            )
        super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state; a gradient round in progress is dropped (an elastic restore
        rolls back past it), so the next backward starts a new one."""
        self._reducer.abandon()
        super().load_state_dict(state_dict)


def _parameter_names(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
) -> dict[torch.Tensor, str]:
    """Horovod's `_parameter_names`: each parameter of `optimizer` -> its name, from
    `named_parameters` (checked) or, without them, `allreduce.noname.<group>.<index>`."""
    if named_parameters is None:
        named = [
            (f"allreduce.noname.{i}.{j}", p)
            for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])
        ]
    else:
        named = list(named_parameters)
        _check_named_parameters(optimizer, named)
    return {p: name for name, p in sorted(named, key=lambda item: item[0])}


def _check_named_parameters(
    optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.Tensor]]
) -> None:
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError(
            "named_parameters should be a sequence of (name, parameter) tuples, usually "
            "from model.named_parameters()"
        )
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique: {duplicates}")
    named_ids = {id(p) for _, p in named}
    unnamed = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters "
            "are not named in it"
        )


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    fusion_threshold_bytes: int = _FUSION_THRESHOLD_BYTES,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """Wrap `optimizer` so that `step()` applies gradients averaged (or summed) over ranks.

    Returns an instance of a subclass of `optimizer`'s class that shares its param_groups,
    state and hooks (`isinstance` still holds). Gradients are reduced as backward produces
    them; with `backward_passes_per_step=N` they accumulate locally and are reduced on the N-th
    backward. `gradient_predivide_factor` f divides by f before the sum and multiplies by
    f/size after it. Buckets start in order, so a parameter that gets no gradient holds its
    bucket and all later ones back until `step()`. Parameters added to `optimizer` after
    wrapping are not reduced; `load_state_dict` drops a round in progress.
    Every rank must wrap the same parameters in the same order. Raises `ValueError` for
    invalid arguments, `NotImplementedError` for `op=Adasum` (use Average); errors of the
    collectives are raised by `step()` / `synchronize()`.

    Sparse gradients are allgathered and stay sparse, as Horovod's; with `sparse_as_dense`
    they are reduced densely and made sparse again (`sparse_gradients.py`). Horovod's
    `num_groups` and `groups` (how allreduces are grouped) are accepted and left to the
    fusion buckets. `process_set` must be the global set (`NotImplementedError` otherwise).
    As Horovod's, the result has `_parameter_names` (parameter -> name), and
    `backward_passes_per_step`, `op`, `gradient_predivide_factor` and `sparse_as_dense`.
    """
    current("hvd.DistributedOptimizer")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    reduce_op = resolve_op(op, None)  # Adasum: NotImplementedError, as in the collectives
    if reduce_op not in (Average, Sum):
        raise ValueError("DistributedOptimizer supports op=Average and op=Sum")
    if gradient_predivide_factor != 1.0 and reduce_op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    names = _parameter_names(optimizer, named_parameters)
    if process_set is not None and process_set.process_set_id != 0:
        raise NotImplementedError(
            "DistributedOptimizer reduces over every rank: limit the model's other "
            "collectives with process_set=, not the optimizer"
        )

    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._reducer = _GradientReducer(
        params,
        compression,
        backward_passes_per_step,
        reduce_op,
        gradient_predivide_factor,
        fusion_threshold_bytes,
        sparse_as_dense,
    )
    wrapped._should_synchronize = True
    wrapped._synchronized = False
    wrapped._parameter_names = names
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped.op = reduce_op
    wrapped.gradient_predivide_factor = gradient_predivide_factor
    wrapped.sparse_as_dense = sparse_as_dense
    registry = context.process_wide().optimizers
    wrapped._reducer.index = len(registry)
    registry.append(weakref.ref(wrapped))
    return wrapped
