"""`broadcast_parameters` and `broadcast_optimizer_state`: every rank starts from the root's
model and optimizer state, as Horovod's functions of the same names make it.

Both are collectives of every rank of the round: each rank must call them with the same
parameters (names, shapes, dtypes) and optimizer structure. A lost peer raises
`WorkerLostError` (a `RuntimeError`); the tensors are then partly updated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.objects import broadcast_object
from elastic.worker.context import current

__all__ = ["broadcast_optimizer_state", "broadcast_parameters"]

_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024


def _named_tensors(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor] | torch.Tensor],
) -> list[torch.Tensor]:
    """The tensors in name order (in given order when some are unnamed)."""
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = [item if isinstance(item, tuple) else (None, item) for item in params]
    if all(name is not None for name, _ in items):
        items.sort(key=lambda item: item[0])
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(value).__name__}")
    return [value for _, value in items]


def _fusion_chunks(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Split `tensors` by (device, dtype), keeping order, into chunks of at most `limit` bytes."""
    by_key: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    for t in tensors:
        key = (t.device, t.dtype)
        nbytes = t.numel() * t.element_size()
        chunks = by_key.setdefault(key, [[]])
        if chunks[-1] and sizes[key] + nbytes > limit:
            chunks.append([])
            sizes[key] = 0
        chunks[-1].append(t)
        sizes[key] = sizes.get(key, 0) + nbytes
    return [chunk for chunks in by_key.values() for chunk in chunks]


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor] | torch.Tensor],
    root_rank: int,
) -> None:
    """Overwrite `params` in place with job rank `root_rank`'s values.

    Named tensors go in sorted-name order, fused per dtype and device. A collective of every
    rank of the round (no process set).

    Args:
        params: a state_dict, or an iterable of (name, tensor) such as
            `model.named_parameters()`, or of bare tensors (kept in their order); every rank
            passes the same names, shapes and dtypes.
        root_rank: the rank whose values every rank gets.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round. The
            tensors are then partly updated.
        ValueError: `root_rank` is not a rank of the round.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.broadcast_parameters")
    if not 0 <= root_rank < ctx.size:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {ctx.size})")
    is_root = ctx.rank == root_rank
    pending = []
    with torch.no_grad():
        for chunk in _fusion_chunks(_named_tensors(params), _FUSION_THRESHOLD_BYTES):
            numels = [t.numel() for t in chunk]
            if sum(numels) == 0:
                continue
            if len(chunk) == 1 and chunk[0].is_contiguous():
                flat = chunk[0]
            elif is_root:
                flat = torch.cat([t.reshape(-1) for t in chunk])
            else:
                flat = torch.empty(sum(numels), dtype=chunk[0].dtype, device=chunk[0].device)
            work = dist.broadcast(flat, group=ctx.group, group_src=root_rank, async_op=True)
            pending.append((work, flat, chunk, numels))
        for work, flat, chunk, numels in pending:
            wait(work)
            if not is_root and flat is not chunk[0]:
                for t, piece in zip(chunk, flat.split(numels), strict=True):
                    t.copy_(piece.view(t.shape))


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer without state its state, as Horovod does before broadcasting it:
    every parameter that requires a gradient gets a zero gradient (sparse for `SparseAdam`)
    and the wrapped optimizer takes one step (never a `DistributedOptimizer` step, which
    would reduce over the ranks). Unlike Horovod, the parameters keep their values (a zero
    step with weight decay would move them on this rank only) and the state is that of an
    optimizer that has taken no step yet (step counts back to 0; see `_as_never_stepped`),
    so training after the broadcast equals training without it, as on one process."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    with torch.no_grad():
        kept = [p.detach().clone() for p in params]
        for p in params:
            grad = torch.zeros_like(p)
            p.grad = grad.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) else grad
    getattr(optimizer, "wrapped_step", optimizer.step)()
    with torch.no_grad():
        for p, value in zip(params, kept, strict=True):
            p.copy_(value)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p in optimizer.state:
                _as_never_stepped(optimizer.state[p], group)


def _as_never_stepped(state: dict[str, Any], group: dict[str, Any]) -> None:
    """One parameter's optimizer state after a zero-gradient step, made that of no step:
    moments of a zero gradient are zero already, the step count is set back to 0, and SGD's
    zero momentum buffer stays only where a first step treats it as a missing one (no
    dampening: `momentum * 0 + grad` is the gradient, as a first step's buffer)."""
    if "step" in state:
        step = state["step"]
        state["step"] = step.zero_() if isinstance(step, torch.Tensor) else 0
    if "momentum_buffer" in state and group.get("dampening", 0) != 0:
        state["momentum_buffer"] = None


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Make every rank's `optimizer` state and hyper-parameters equal to job rank `root_rank`'s.

    As Horovod's, an optimizer without state first gets it (`_initialize_state`: every parameter
    that requires a gradient is left with a zero gradient). The others then `load_state_dict`
    the root's state_dict, so state tensors move to their parameter's device. A collective of
    every rank of the round.

    Args:
        optimizer: this rank's optimizer; every rank's has the same parameter groups.
        root_rank: the rank whose state every rank gets.

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: `root_rank` is not a rank of the round (raised on every rank).
        ValueError: the root's parameter groups do not fit this rank's optimizer (from
            `load_state_dict`, on the others).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    ctx = current("hvd.broadcast_optimizer_state")
    _initialize_state(optimizer)
    is_root = ctx.rank == root_rank
    state = _to_cpu(optimizer.state_dict()) if is_root else None
    state = broadcast_object(state, root_rank)
    if not is_root:
        optimizer.load_state_dict(state)
