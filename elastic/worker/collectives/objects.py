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
    """Return job rank `root_rank`'s `obj` on every rank of `process_set` (the root gets its own
    object back).

    The object travels pickled, which is safe here only because peers are the job's own
    authenticated workers. Tensors inside keep their device.

    Args:
        obj: the root's object; ignored on the others.
        root_rank: the job rank whose object every member gets; a member of `process_set`.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        The root's object (on the others, an unpickled copy).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        pickle's error: on a rank whose object does not pickle or unpickle; the other ranks then
            wait as for a lost peer.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
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
    """Return every rank's `obj` as a list in rank order, pickled as `broadcast_object` does.

    Args:
        obj: this rank's object.
        name: a key for the call, as Horovod's: refused while a call of that name is in flight
            on this rank; a named asynchronous call that the other ranks make later waits for
            them.
        process_set: the ranks that take part (default: all); its members, and only they, call
            it.

    Returns:
        A list of every member's object, in rank order (this rank's own is a copy too).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: the ranks' arguments do not agree (raised on every rank, with
            the same message, before any data moves), or `name` is held by a call still in
            flight on this rank (raised on this rank alone).
        pickle's error: on a rank whose object does not pickle or unpickle; the other ranks then
            wait as for a lost peer.
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
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
