"""What a checkpoint may hold: the values `torch.load(..., weights_only=True)` gives back.

Durable commits are loaded with `weights_only=True`, whose unpickler builds only tensors,
plain containers and a few torch types, never an arbitrary object, so a file planted in a
checkpoint directory cannot run code in the worker that loads it. A commit must therefore
hold only such values; `first_unloadable` finds, before anything is written, the first one
that is not, so that the commit that holds it fails at once rather than the load of a
later job.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from elastic.errors import ElasticError

TRUST_FLAG = "--checkpoint-trust-pickles"  # the opt-in into full pickles (see `CheckpointDir`)

# Exact types (a subclass pickles as its own class, which the loader refuses): what torch's
# weights-only unpickler builds by default (torch 2.13: `_weights_only_unpickler`).
_PLAIN = frozenset(
    {
        type(None), bool, int, float, complex, str, bytes, bytearray,
        list, tuple, dict, set, collections.OrderedDict, collections.Counter,
        torch.Size, torch.dtype, torch.device, torch.layout,
        torch.Tensor, torch.nn.Parameter,
    }
)  # fmt: skip


class UnloadableCommit(ElasticError, TypeError):
    """A commit holds a value that a checkpoint cannot hold (see the module's docstring).
    Raised by `State.commit()` on every rank, at the commit that would have been written."""


def _safe_global_types() -> frozenset[type]:
    """Classes the script registered with `torch.serialization.add_safe_globals`."""
    found = set()
    for entry in torch.serialization.get_safe_globals():
        value = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(value, type):
            found.add(value)
    return frozenset(found)


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
_LEAVES = _SCALARS | {torch.Tensor, torch.nn.Parameter}  # a tensor: a leaf unless it has fields


def _fields(value: Any) -> Any:
    return getattr(value, "__dict__", None)


def _children(item: Any) -> list[tuple[str, Any]]:
    """The values `item` holds, each with how to name it from `item` (e.g. `[3]`)."""
    children: list[tuple[str, Any]] = []
    if isinstance(item, dict):
        for key, child in item.items():
            children.append((" (a key)", key))
            children.append((f"[{key!r}]", child))
    elif isinstance(item, (list, tuple)):
        children.extend((f"[{i}]", child) for i, child in enumerate(item))
    elif isinstance(item, set):
        children.extend((" (an element)", child) for child in item)
    attributes = getattr(item, "__dict__", None)
    if attributes:  # an OrderedDict's `_metadata`, a tensor's or a safe class's fields
        children.extend((f".{name}", child) for name, child in attributes.items())
    return children


def _all_loadable(value: Any, allowed: frozenset[type]) -> bool:
    """Whether every value in `value` loads back: the quick walk, which names nothing."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind not in allowed:
            return False
        if id(item) in seen:
            continue
        seen.add(id(item))
        parts = (item.keys(), item.values()) if isinstance(item, dict) else (item,)
        if isinstance(item, (dict, list, tuple, set)):
            for part in parts:  # whole containers of scalars or plain tensors at C speed
                kinds = set(map(type, part))
                if not kinds <= _LEAVES or (not kinds <= _SCALARS and any(map(_fields, part))):
                    stack.extend(part)
        attributes = _fields(item)
        if attributes:
            stack.extend(attributes.values())
    return True


def first_unloadable(value: Any, where: str) -> str | None:
    """Where in `value` (named `where`) the first value lies that `torch.load(...,
    weights_only=True)` would refuse, and its type, e.g. `state.history[3] is a
    numpy.float64`; None when every value loads back. Walks containers (dict keys and
    values, an `OrderedDict`'s attributes, a tensor's attributes, a registered safe class's
    attributes) without recursion, each container once; a second walk, which names what it
    passes, runs only once the first found something."""
    allowed = _PLAIN | _safe_global_types()
    if _all_loadable(value, allowed):
        return None
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, item = stack.pop()
        kind = type(item)
        if kind not in allowed:
            name = kind.__qualname__
            if kind.__module__ != "builtins":
                name = f"{kind.__module__}.{name}"
            return f"{path} is a {name}"
        if kind in _SCALARS or id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend((path + step, child) for step, child in reversed(_children(item)))
    return None


def refusal_of(payload: Any) -> str | None:
    """Why a state's durable payload (`{"objects": {name: value}, "handlers": {name:
    snapshot}}`) cannot be a checkpoint, naming the value as `state.<name>...`; None when
    it can."""
    if isinstance(payload, dict) and set(payload) <= {"objects", "handlers"}:
        parts = [
            part for key in ("handlers", "objects") if isinstance(part := payload.get(key), dict)
        ]
        for part in parts:
            for name, value in part.items():
                if found := first_unloadable(value, f"state.{name}"):
                    return _explained(found)
        return None
    found = first_unloadable(payload, "the payload")
    return None if found is None else _explained(found)


def _explained(found: str) -> str:
    return (
        f"{found}, which a checkpoint cannot hold: durable commits are loaded with "
        "torch.load(weights_only=True), which builds only tensors and plain values (None, "
        "bool, int, float, complex, str, bytes, list, tuple, dict, set, OrderedDict, "
        "torch.Size/dtype/device); store it as those, register its class with "
        f"torch.serialization.add_safe_globals, or, if you trust everyone who can write the "
        f"checkpoint directory, launch with {TRUST_FLAG}"
    )
