"""Horovod's `broadcast_object` and `allgather_object`: any picklable object, moved as its
pickle's bytes.

Unpickling what peers send is safe here only because peers are the job's own authenticated
workers. A lost peer or a broken round raises `WorkerLostError`.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from elastic.worker.collectives.checks import Kind, check_root
from elastic.worker.collectives.handles import complete, wait
from elastic.worker.collectives.negotiation import checked
from elastic.worker.collectives.process_sets import ProcessSet, global_process_set
from elastic.worker.collectives.row_gather import first_dims, start_gather
from elastic.worker.context import current

__all__ = ["allgather_object", "broadcast_object"]


def _pickled(obj: Any) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
    )


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Return `root_rank`'s `obj` on every rank (the root gets its own object back).

    Uses pickle, which is safe here only because peers are the job's own authenticated
    workers. Tensors inside keep their device."""
    ctx = current("hvd.broadcast_object")
    what = "hvd.broadcast_object"
    length = torch.zeros(1, dtype=torch.int64)
    where, _ = checked(ctx, process_set, Kind.BROADCAST, what, [length], root=root_rank, name=name)
    check_root(root_rank, where, what)
    is_root = where.members[where.rank] == root_rank
    src = where.members.index(root_rank)
    payload = _pickled(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length[0] = payload.numel()
    wait(dist.broadcast(length, group=where.group, group_src=src, async_op=True))
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    wait(dist.broadcast(payload, group=where.group, group_src=src, async_op=True))
    if is_root:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Return every rank's `obj` as a list in rank order (pickled, like `broadcast_object`)."""
    ctx = current("hvd.allgather_object")
    payload = _pickled(obj)
    what = "hvd.allgather_object"
    where, rows = checked(ctx, process_set, Kind.ALLGATHER, what, [payload], name=name)
    dims = [row[0] for row in first_dims(where, [payload], rows)]
    blob = complete(start_gather(where, payload, dims)).numpy()
    objects, offset = [], 0
    for dim in dims:
        objects.append(pickle.loads(blob[offset : offset + dim].tobytes()))
        offset += dim
    return objects
