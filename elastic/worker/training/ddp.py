"""`hvd.elastic.DistributedDataParallel`: a DDP model that follows the job's rounds.

torch's `DistributedDataParallel` binds to the process group it is built in, and the worker
runtime forms a new one every round. The wrapper is an `nn.Module` whose only submodule is the
user's module (its parameters, `state_dict` keys `module.*` as DDP's, and `.module` are the
same objects in every round), and which forwards to an inner torch DDP that it builds over
the current round's group, anew after each re-form.

The contract:

* construction is local (no collective): a joiner builds the wrapper before the incumbents
  reach it, as it builds its `TorchState`;
* the first forward of each round (re)builds the inner DDP: the last round's DDP is dropped
  (its autograd hooks removed), rank 0's parameters and buffers are broadcast to every rank,
  as DDP's construction does, and the new DDP gets fresh buckets (rebuilt in gradient order
  after its first step, as any DDP's). Under `hvd.elastic.run` that forward comes after
  `state.sync()`, so every rank, rank 0 included, already holds the newest commit and the
  broadcast changes nothing; every rank must call it, as it must call any forward of a DDP;
* every collective goes through the runtime's wait, so a lost peer raises `WorkerLostError`,
  never a plain `RuntimeError` or a hang: the build's broadcast and the buffers' broadcast
  before each forward (done here, DDP's own turned off), and the gradient reduction
  (`ddp_gradients`). A peer lost inside DDP's own exchange of the used-parameter map
  (`find_unused_parameters=True` only) still surfaces as DDP's `RuntimeError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from elastic.worker.context import WorkerContext, current
from elastic.worker.torch_versions import ddp_without_own_sync
from elastic.worker.training import step_boundary
from elastic.worker.training.ddp_checks import (
    WRAPPER,
    check_ddp_arguments,
    check_devices,
    check_module,
)
from elastic.worker.training.ddp_gradients import BucketReduction, reduce_bucket
from elastic.worker.training.state_broadcasts import broadcast_parameters

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.Module):
    """`torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)` that keeps working
    across re-forms: use it wherever a DDP model is used, with a plain torch optimizer over
    `model.parameters()` (not `hvd.DistributedOptimizer`, which would reduce again), and hand
    it to `TorchState(model=...)`, which commits and restores the module's state.

    Args:
        module: the model, on the CPU or on this worker's GPU (`hvd.local_rank()`).
        broadcast_buffers / forward_sync_buffers: broadcast rank 0's buffers before each
            forward, as DDP does (default True).
        **ddp_kwargs: DDP's other arguments (`bucket_cap_mb`, `find_unused_parameters`,
            `gradient_as_bucket_view`, `static_graph`, `device_ids`, ...), given to each
            round's DDP. Not taken: `process_group`, `device_mesh` (bound per round),
            `init_sync` (every build broadcasts), `mixed_precision`,
            `delay_all_reduce_named_params`, `param_to_hook_all_reduce` (they reduce outside
            the wrapper's communication hook).

    Raises:
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()` (here, and at a
            forward).
        UnsupportedModelError: a module wrapped already (in this wrapper or a torch DDP), one
            without a parameter that requires a gradient, one on several devices or on a
            device other than the CPU or this worker's GPU, `device_ids` naming another GPU,
            or an argument above that is not taken (here, before any collective).
    """

    def __init__(self, module: torch.nn.Module, **ddp_kwargs: Any) -> None:
        super().__init__()
        ctx = current(WRAPPER)
        check_module(module, DistributedDataParallel)
        sync = ddp_kwargs.pop("broadcast_buffers", True)
        sync = ddp_kwargs.pop("forward_sync_buffers", sync)
        check_ddp_arguments(ddp_kwargs)
        self._check_devices(module, ctx, ddp_kwargs)
        self.module = module
        self._sync_buffers = bool(sync)
        self._ddp_kwargs = ddp_kwargs
        self._ddp: TorchDDP | None = None
        self._group: dist.ProcessGroup | None = None  # the round's group _ddp is bound to

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_ddp":  # never a submodule: the parameters are registered once, here
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy`, `torch.save`) holds no DDP: it builds its own at its first
        forward, as a new round does."""
        state = self.__dict__.copy()
        state["_ddp"], state["_group"] = None, None
        return state

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The module's forward through this round's DDP, (re)built first in a new round.
        Raises `WorkerLostError` when a peer is lost during a broadcast."""
        step_boundary.boundary()  # the last step is booked: this one begins
        ddp, built = self._bound()
        if not built and self._sync_buffers and ddp.require_forward_param_sync:
            buffers = dict(self.module.named_buffers())
            if buffers:
                broadcast_parameters(buffers, 0)
        return ddp(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's `no_sync()` on this round's DDP: backward passes inside accumulate gradients
        locally; the first one outside reduces them all."""
        ddp, _ = self._bound()
        with ddp.no_sync():
            yield

    def _bound(self) -> tuple[TorchDDP, bool]:
        """This round's DDP, and whether it was built just now."""
        ctx = current(f"{WRAPPER} (forward)")
        if self._ddp is not None and self._group is ctx.group:
            return self._ddp, False
        self._release()
        self._check_devices(self.module, ctx, self._ddp_kwargs)
        tensors = self.module.named_parameters()
        if self._sync_buffers:
            tensors = chain(tensors, self.module.named_buffers())
        broadcast_parameters(dict(tensors), 0)
        ddp = TorchDDP(
            self.module, process_group=ctx.group, **self._ddp_kwargs, **ddp_without_own_sync()
        )
        ddp.register_comm_hook(BucketReduction(ctx), reduce_bucket)
        self._ddp, self._group = ddp, ctx.group
        return ddp, True

    def _release(self) -> None:
        """Drop the last round's DDP. Its reducer's hooks on the parameters' gradient
        accumulators go with it, at once: a step that failed halfway left it expecting the
        rest of that backward, and the next backward must not reach it."""
        ddp, self._ddp, self._group = self._ddp, None, None
        if ddp is not None:
            remove = getattr(ddp.reducer, "_remove_autograd_hooks", None)
            if remove is not None:
                remove()

    @staticmethod
    def _check_devices(module: torch.nn.Module, ctx: WorkerContext, kwargs: dict) -> None:
        check_devices(
            module,
            ctx.device,
            ctx.slot.local_rank,
            kwargs.get("device_ids"),
            kwargs.get("output_device"),
        )
