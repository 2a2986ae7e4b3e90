"""`DistributedOptimizer`: Horovod's wrapper that makes any torch optimizer apply gradients
averaged (or summed) over all ranks.

The wrapped optimizer's `step()` waits for the gradients' allreduces, which start while
backward runs (`gradient_reducer.py`), writes the reduced gradients back, then updates the
parameters. Sparse gradients are reduced as Horovod reduces them (`sparse_gradients.py`).
When the membership changes (a member leaves, a worker joins, a host goes), every rank raises
`HostsUpdatedInterrupt` at the same step.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from elastic.worker import context
from elastic.worker.collectives.compression import Compression, Compressor
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.collectives.reduce_ops import Average, Sum, resolve_op
from elastic.worker.context import current
from elastic.worker.errors import HostsUpdatedInterrupt
from elastic.worker.training import step_boundary
from elastic.worker.training.gradient_reducer import GradientReducer

__all__ = ["DistributedOptimizer"]

_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024


class _DistributedOptimizer(torch.optim.Optimizer):
    """Placed before the wrapped optimizer's class in a dynamically created subclass."""

    _reducer: GradientReducer
    _should_synchronize: bool
    _synchronized: bool

    def synchronize(self) -> None:
        """Wait for all gradient allreduces of this step and write the results to `.grad`.

        Parameters whose gradient this rank never computed contribute zeros and receive the
        reduced gradient. Raises `WorkerLostError` if a peer dies (as the collectives do);
        the step's gradients are then dropped, so that the step can run again after the job
        re-forms.
        """
        ctx = current("DistributedOptimizer.synchronize")
        where = Scope(group=ctx.group, members=tuple(range(ctx.size)), rank=ctx.rank)
        self._reducer.synchronize(where, ctx.round)
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

        When the last step's allreduce agreed that the round ends (a member is leaving: it got
        SIGTERM or a preemption notice; or some rank heard of a newer round from the driver:
        a worker joins, a host goes), every rank raises `HostsUpdatedInterrupt` here instead,
        at the same step, before this step changes anything: a leaver goes, the others re-form
        and go on from the state after the last step, with nothing rolled back; a joiner gets
        that state in the run loop's sync. `skip_sync` is this rank's view (no worker joins,
        as far as it heard); the sync's own survey decides for all."""
        step_boundary.boundary()  # the last step is booked: this one begins
        ctx = current("DistributedOptimizer.step")
        if self._reducer.word.take(ctx.round):
            self._reducer.abandon()  # this step's gradients: it never happened
            self._synchronized = False
            update = ctx.events.pending_update(ctx.round)
            raise HostsUpdatedInterrupt(skip_sync=update is None or not update.added, at_step=True)
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

    def drop_gradients(self) -> None:
        """Forget this step's gradients and any reduction of them still in flight (the
        round broke; the step runs again in the next)."""
        self._reducer.abandon()
        self._synchronized = False
        super().zero_grad(set_to_none=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state; a gradient reduction in progress is dropped (an elastic restore
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
    wrapping are not reduced; `load_state_dict` drops a reduction in progress.
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
    wrapped._reducer = GradientReducer(
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
