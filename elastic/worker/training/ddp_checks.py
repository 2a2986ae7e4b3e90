"""What `hvd.elastic.DistributedDataParallel` and `TorchState` refuse, each in one line that
says what to change, raised where the model is handed over (before any collective, on every
rank alike): the wrapper's construction and every rebuild, `TorchState(model=...)`.

A module that a plain `torch.nn.parallel.DistributedDataParallel` wraps stays bound to the
process group of the round it was built in, and its gradient reduction fails or hangs at the
first re-form; the elastic wrapper is the form that follows the rounds.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from elastic.errors import ElasticError

__all__ = [
    "UnsupportedModelError",
    "WRAPPER",
    "check_ddp_arguments",
    "check_devices",
    "check_module",
    "refuse_plain_ddp",
]

WRAPPER = "hvd.elastic.DistributedDataParallel"

_OWN_GROUP = "it binds each round's DDP to that round's process group itself"
_OWN_HOOK = "it reduces every gradient through its own communication hook"
# DistributedDataParallel's arguments that the wrapper sets itself or could not keep.
_REFUSED = {
    "process_group": _OWN_GROUP,
    "device_mesh": _OWN_GROUP,
    "init_sync": "every build broadcasts rank 0's parameters and buffers, as DDP's does",
    "mixed_precision": _OWN_HOOK + ", and DDP's mixed precision registers another",
    "delay_all_reduce_named_params": _OWN_HOOK + ", and DDP would reduce these outside it",
    "param_to_hook_all_reduce": _OWN_HOOK + ", and DDP would reduce these outside it",
}


class UnsupportedModelError(ElasticError, ValueError):
    """A model, or an argument for it, that the elastic runtime cannot keep across re-forms
    in the form given; the message names what to change. Raised on every rank alike (each
    rank hands over the same model), before any collective, so no rank goes on alone."""


def check_ddp_arguments(kwargs: Mapping[str, Any]) -> None:
    """Refuse the `DistributedDataParallel` arguments the wrapper sets itself, and names that
    are none of its arguments."""
    known = inspect.signature(TorchDDP.__init__).parameters
    for name in kwargs:
        if name in _REFUSED:
            raise UnsupportedModelError(f"{WRAPPER}: {name}= is not taken: {_REFUSED[name]}")
        if name not in known or name in ("self", "module"):
            raise UnsupportedModelError(
                f"{WRAPPER}: {name}= is no argument of torch's DistributedDataParallel"
            )


def check_module(module: Any, wrapper: type) -> None:
    """`module` is a `torch.nn.Module`, not wrapped already (by `wrapper` or by torch's DDP,
    anywhere inside it), with a parameter that requires a gradient."""
    if not isinstance(module, torch.nn.Module):
        raise UnsupportedModelError(f"{WRAPPER} wraps a torch.nn.Module, not a {_kind(module)}")
    if isinstance(module, wrapper):
        raise UnsupportedModelError(
            f"{WRAPPER}: the module is wrapped already; use it as it is, or wrap its .module"
        )
    if isinstance(module, TorchDDP):
        raise UnsupportedModelError(
            f"{WRAPPER}: the module is a torch DistributedDataParallel already; wrap its "
            ".module instead (the plain DDP would stay bound to this round's process group)"
        )
    if inner := _plain_ddp_inside(module):
        raise UnsupportedModelError(
            f"{WRAPPER}: the module holds a torch DistributedDataParallel ({inner!r}); build "
            "it from the plain modules and wrap the whole once"
        )
    if not any(p.requires_grad for p in module.parameters()):
        raise UnsupportedModelError(
            f"{WRAPPER}: the module has no parameter that requires a gradient: there is "
            "nothing to reduce"
        )


def check_devices(
    module: torch.nn.Module,
    device: torch.device,
    local_rank: int,
    device_ids: Iterable[int | torch.device] | None,
    output_device: int | torch.device | None,
) -> None:
    """The module's parameters and buffers are on one device: the CPU, or this worker's GPU
    (`device`, the round's device for `local_rank`); `device_ids` and `output_device`, when
    given, name that GPU."""
    devices = {t.device for t in chain(module.parameters(), module.buffers())}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise UnsupportedModelError(
            f"{WRAPPER}: the module's parameters and buffers are on {names}: put them on one "
            f"device (this worker's is {device}) with module.to(...)"
        )
    (on,) = devices
    given = [_index(d) for d in device_ids or ()]
    if output_device is not None:
        given.append(_index(output_device))
    if on.type == "cpu":
        if given:
            raise UnsupportedModelError(
                f"{WRAPPER}: device_ids and output_device are for a module on a GPU; this one "
                "is on the CPU: leave them out"
            )
        return
    if on.type != "cuda" or on != device:
        raise UnsupportedModelError(
            f"{WRAPPER}: the module is on {on}, but this worker (local rank {local_rank}) "
            f"trains on {device}: move it there with module.to({str(device)!r}) first"
        )
    if any(index != on.index for index in given):
        raise UnsupportedModelError(
            f"{WRAPPER}: device_ids={list(device_ids or ())} and output_device="
            f"{output_device} must name the module's device, {on}, or be left out"
        )


def refuse_plain_ddp(where: str, value: Any) -> None:
    """Refuse a module that is, or holds, a plain torch DistributedDataParallel (handed to
    `TorchState` as `where`): it would fail or hang at the first re-form."""
    if not isinstance(value, torch.nn.Module):
        return
    if isinstance(value, TorchDDP) or _plain_ddp_inside(value):
        raise UnsupportedModelError(
            f"{where} holds a torch.nn.parallel.DistributedDataParallel, which stays bound to "
            "the process group of the round it was built in and fails at the first re-form: "
            f"wrap the module with {WRAPPER}(module, ...) instead"
        )


def _plain_ddp_inside(module: torch.nn.Module) -> str | None:
    """The name of a plain torch DDP among `module`'s submodules, if one is."""
    for name, inner in module.named_modules():
        if name and isinstance(inner, TorchDDP):
            return name
    return None


def _index(device: int | torch.device | str) -> int | None:
    return device if isinstance(device, int) else torch.device(device).index


def _kind(value: Any) -> str:
    return type(value).__name__
