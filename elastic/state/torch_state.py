"""TorchState: models, optimizers, LR schedulers and ElasticSamplers as elastic state.

Snapshots of tensors live in host memory only: a GPU tensor is copied straight into a CPU
(pinned, where CUDA is available) buffer, never into a second GPU tensor, and the buffers of
the previous snapshot are reused when shapes and dtypes still match. `restore()` copies the
snapshot back onto the devices the live tensors are on.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from typing import Any

import torch

from elastic.state.sampler import ElasticSampler, merge_sampler_states
from elastic.state.state import ObjectState
from elastic.worker.collectives.objects import allgather_object, broadcast_object
from elastic.worker.training import step_boundary
from elastic.worker.training.ddp_checks import refuse_plain_ddp
from elastic.worker.training.state_broadcasts import (
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["TorchState", "host_snapshot"]

log = logging.getLogger("elastic")


def _tensor_to_host(tensor: torch.Tensor, previous: Any, devices: set[torch.device]) -> Any:
    tensor = tensor.detach()
    if (
        isinstance(previous, torch.Tensor)
        and previous.device.type == "cpu"
        and previous.shape == tensor.shape
        and previous.dtype == tensor.dtype
        and previous.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    ):
        out = previous
    elif tensor.device.type == "cpu":
        return tensor.clone()
    else:
        try:
            out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        except RuntimeError:  # no pinned memory to be had: pageable memory works, slower
            out = torch.empty(tensor.shape, dtype=tensor.dtype)
    asynchronous = tensor.device.type == "cuda" and out.is_pinned()
    out.copy_(tensor, non_blocking=asynchronous)
    if asynchronous:
        devices.add(tensor.device)
    return out


def _to_host(value: Any, previous: Any, devices: set[torch.device]) -> Any:
    """A copy of `value` (a state_dict) whose tensors are in host memory, reusing the tensors
    of `previous` (the last copy) where the same place holds a matching one. `devices`
    collects the CUDA devices with copies still in flight."""
    if isinstance(value, torch.Tensor):
        return _tensor_to_host(value, previous, devices)
    if isinstance(value, dict):
        before = previous if isinstance(previous, dict) else {}
        items = [(k, _to_host(v, before.get(k), devices)) for k, v in value.items()]
        out: dict[Any, Any] = OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
        if hasattr(value, "_metadata"):  # Module.state_dict's per-module versions
            out._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
        return out
    if type(value) in (list, tuple):
        before = previous if type(previous) is type(value) and len(previous) == len(value) else ()
        items = [_to_host(v, before[i] if before else None, devices) for i, v in enumerate(value)]
        return type(value)(items)
    return copy.deepcopy(value)


def host_snapshot(state_dict: Any, previous: Any) -> Any:
    """A copy of `state_dict` (nested dicts, lists and tuples) whose tensors are in host
    memory, reusing `previous`'s buffers where they match; copies from a GPU are finished
    when it returns."""
    devices: set[torch.device] = set()
    snapshot = _to_host(state_dict, previous, devices)
    for device in devices:
        torch.cuda.synchronize(device)
    return snapshot


class _Handler:
    """How one tracked object is saved, restored and synced.

    A durable write may hold the current snapshot (`lend`) while training goes on: the next
    save then fills the snapshot the last finished write gave back (`release`), or new
    buffers, never the one being written (`_reusable`)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = None
        self.lent: Any = None  # the snapshot a durable write holds
        self.spare: Any = None  # a snapshot a finished write gave back, to be filled next

    def lend(self) -> Any:
        self.lent = self.saved
        return self.saved

    def release(self) -> None:
        """The durable write is over (called from the writer's thread)."""
        if self.lent is not None and self.lent is not self.saved:
            self.spare = self.lent
        self.lent = None

    def _reusable(self) -> Any:
        """The snapshot whose buffers the next save may overwrite."""
        if self.lent is None or self.lent is not self.saved:
            return self.saved
        spare, self.spare = self.spare, None
        return spare

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync_from(self, root_rank: int) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def save(self) -> None:
        self.saved = host_snapshot(self.value.state_dict(), self._reusable())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)  # copies into the live tensors, on their device

    def sync_from(self, root_rank: int) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank)


class _OptimizerHandler(_Handler):
    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.hook: Any = None  # the step counter's hook (`TorchState._count_steps_of`)

    def drop_step(self) -> None:
        """Forget the gradients of the step in flight (and a `DistributedOptimizer`'s
        reductions of them)."""
        drop = getattr(self.value, "drop_gradients", None)
        if drop is not None:
            drop()
        else:
            self.value.zero_grad(set_to_none=True)

    def save(self) -> None:
        self.saved = host_snapshot(self.value.state_dict(), self._reusable())

    def restore(self) -> None:
        # load_state_dict keeps the tensors it is given when they are already on the right
        # device: hand it copies, so training never writes into the snapshot.
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync_from(self, root_rank: int) -> None:
        broadcast_optimizer_state(self.value, root_rank)


class _SchedulerHandler(_Handler):
    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync_from(self, root_rank: int) -> None:
        state = broadcast_object(self.value.state_dict(), root_rank)
        self.value.load_state_dict(state)


class _SamplerHandler(_Handler):
    def save(self) -> None:
        self.saved = self.value.state_dict()

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync_from(self, root_rank: int) -> None:
        self.merge(root_rank)

    def merge(self, root_rank: int) -> None:
        """Take `root_rank`'s epoch and the union of every rank's processed indices in it."""
        states = allgather_object(self.value.state_dict())
        self.value.load_state_dict(merge_sampler_states(states, root_rank))
        self.value.unshared = False


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return _SchedulerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch training process.

    Every keyword argument becomes an attribute. Modules, optimizers, LR schedulers and
    `ElasticSampler`s (any number, under any names) are handled by type:

    * models: `state_dict()` snapshots in host memory; `restore()` loads them back (onto the
      parameters' own devices); sync broadcasts parameters and buffers (`broadcast_parameters`).
      A DDP model is given as `hvd.elastic.DistributedDataParallel` (its state is the
      module's); a plain torch `DistributedDataParallel`, which cannot follow a re-form,
      raises `UnsupportedModelError` here, naming the wrapper;
    * optimizers: the same with `broadcast_optimizer_state` (every rank's optimizer must have
      the same parameter groups); LR schedulers: their state_dict, broadcast as an object;
    * samplers: epoch and processed indices are saved and restored; sync takes the source's
      epoch and the union of the processed indices of every rank (an `allgather_object`),
      so after a shrink or grow each sample of the epoch is processed once; `on_reset()`
      re-shards them for the new rank and size, and when membership changes they are merged
      across the old round's ranks before `HostsUpdatedInterrupt` is raised;
    * anything else: as in `ObjectState` (deep copies, `broadcast_object`).

    `model` and `optimizer` left as None are plain attributes, not tracked. Assigning a new
    object to a handled name (`state.model = other`) tracks it and snapshots it at once.
    Sync order is the order of the keyword arguments (handled objects first), the same on
    every rank. If a peer dies in `sync()`, the collective's `WorkerLostError` propagates with
    the live state partly overwritten and the snapshot untouched.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        checkpoint_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in {"model": model, "optimizer": optimizer, **kwargs}.items():
            refuse_plain_ddp(f"TorchState({name}=...)", value)
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
            elif value is not None or name not in ("model", "optimizer"):
                plain[name] = value
        self._check_names(handlers)
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        for name in ("model", "optimizer"):
            if name not in handlers and name not in plain:
                object.__setattr__(self, name, None)
        super().__init__(checkpoint_dir, **plain)
        for handler in handlers.values():
            self._count_steps_of(handler)
            handler.save()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers: dict[str, _Handler] | None = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            refuse_plain_ddp(f"TorchState.{name}", value)
            handler = _handler_for(value)
            if handler is None:
                raise TypeError(
                    f"TorchState.{name} holds a {type(handlers[name].value).__name__}; "
                    f"it cannot become a {type(value).__name__}"
                )
            old = handlers[name]
            if isinstance(old, _OptimizerHandler) and old.hook is not None:
                old.hook.remove()
            self._count_steps_of(handler)
            handler.save()
            handlers[name] = handler
        super().__setattr__(name, value)

    def _count_steps_of(self, handler: _Handler) -> None:
        """Count each step `handler`'s optimizer applies (`State._steps`), and mark it as
        not yet booked (`step_boundary`)."""
        if not isinstance(handler, _OptimizerHandler):
            return

        def stepped(*_: Any) -> None:
            self._steps += 1
            step_boundary.applied()

        handler.hook = handler.value.register_step_post_hook(stepped)

    def _counts_steps(self) -> bool:
        return any(isinstance(h, _OptimizerHandler) for h in self._handlers.values())

    def _drop_step(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, _OptimizerHandler):
                handler.drop_step()

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync_from(self, root_rank: int) -> None:
        for handler in self._handlers.values():
            handler.sync_from(root_rank)
        super().sync_from(root_rank)

    def on_reset(self) -> None:
        """Re-shard every `ElasticSampler` for the new rank and size, then run the reset
        callbacks."""
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()
        super().on_reset()

    def _durable_payload(self) -> Any:
        handlers = {name: handler.lend() for name, handler in self._handlers.items()}
        return {**super()._durable_payload(), "handlers": handlers}

    def _durable_written(self) -> None:
        for handler in self._handlers.values():
            handler.release()

    def _load_durable(self, payload: Any) -> None:
        saved = payload.get("handlers", {})
        if missing := [name for name in self._handlers if name not in saved]:
            log.warning("the durable commit holds no %s: kept as they are", ", ".join(missing))
        for name, handler in self._handlers.items():
            if name in saved:
                handler.saved = saved[name]
                try:
                    handler.restore()
                except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as err:
                    raise ValueError(
                        f"the durable commit's {name!r} does not fit this state: {err}"
                    ) from err
        super()._load_durable(payload)

    def _holds_unshared(self) -> bool:
        return any(
            isinstance(handler, _SamplerHandler) and handler.value.unshared
            for handler in self._handlers.values()
        )

    def prepare_to_reform(self, members_leave: bool = True) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.merge(0)  # every rank is at the same commit, so in the same data epoch
                handler.save()
