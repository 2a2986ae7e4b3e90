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


def first_unloadable(value: Any, where: str) -> str | None:
    """Where in `value` (named `where`) the first value lies that `torch.load(...,
    weights_only=True)` would refuse, and its type, e.g. `state.history[3] is a
    numpy.float64`; None when every value loads back. Walks containers (dict keys and
    values, an `OrderedDict`'s attributes, a tensor's attributes, a registered safe class's
    attributes) without recursion, each container once."""
    allowed = _PLAIN | _safe_global_types()
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, item = stack.pop()
        kind = type(item)
        if kind not in allowed:
            name = (
                kind.__qualname__
                if kind.__module__ == "builtins"
                else (f"{kind.__module__}.{kind.__qualname__}")
            )
            return f"{path} is a {name}"
        if (
            kind in (type(None), bool, int, float, complex, str, bytes, bytearray)
            or id(item) in seen
        ):
            continue
        seen.add(id(item))
        children: list[tuple[str, Any]] = []
        if isinstance(item, dict):
            for key, child in item.items():
                children.append((f"{path} (a key)", key))
                children.append((f"{path}[{key!r}]", child))
        elif isinstance(item, (list, tuple)):
            children.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
        elif isinstance(item, set):
            children.extend((f"{path} (an element)", child) for child in item)
        attributes = getattr(item, "__dict__", None)
        if attributes:  # an OrderedDict's `_metadata`, a tensor's or a safe class's fields
            children.extend((f"{path}.{name}", child) for name, child in attributes.items())
        stack.extend(reversed(children))
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
