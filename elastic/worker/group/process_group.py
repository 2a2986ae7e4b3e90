"""Creating the process group of one round, and abandoning it when the round ends."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from elastic.errors import ElasticError
from elastic.worker import context
from elastic.worker.errors import WorkerLostError
from elastic.worker.torch_versions import set_group_timeout


def device_for(local_rank: int) -> torch.device:
    """CUDA device `local_rank` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """Gloo for CPU tensors; with CUDA also NCCL for CUDA tensors, in the same group."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


# For the ranks' connections, once all are there. Gloo's side that waits for a peer to connect
# in waits five times this ("Connect timeout [none]"): at 10 s a peer that died while the ranks
# connected held its survivors for 50 s (fault soak seed 729057); at 2 s, for 10 s.
CONNECT_TIMEOUT = timedelta(seconds=2)


def create_group(
    store: dist.Store,
    rank: int,
    size: int,
    device: torch.device,
    timeout: timedelta,
    connect_timeout: timedelta = CONNECT_TIMEOUT,
) -> dist.ProcessGroup:
    """Form the default process group over `store`; every rank of the round must call this.

    Waiting for the other ranks to publish their addresses lasts as long as the store waits
    (a `DriverStore`: `timeout`, or its `RoundSuperseded` as soon as a newer round forms).
    The connections between the ranks must then complete within `connect_timeout` (at most
    `timeout`; a rank waiting for a peer to connect in waits five times that): a peer that
    published its address and then died or stopped makes Gloo retry its connection, and this
    raises RuntimeError then rather than after `timeout`. The
    group's collectives get `timeout`. Raises RuntimeError or TimeoutError if a peer does not
    arrive within the store's wait.
    """
    _reset_group_names()
    dist.init_process_group(
        backend=backend_for(device), store=store, rank=rank, world_size=size,
        timeout=min(timeout, connect_timeout),
    )  # fmt: skip
    group = dist.group.WORLD
    assert group is not None
    set_group_timeout(timeout, group)
    return group


def create_round_subgroup(
    timeout: timedelta,
    broken: Callable[[], str | None],
    connect_timeout: timedelta = CONNECT_TIMEOUT,
) -> dist.ProcessGroup:
    """Form a Gloo group of all of the round's ranks beside its default group (every rank of
    the round must call this, in the same order), for work of its own (a background thread's
    collectives), and return it.

    As `create_group`: waiting for the others to publish their addresses lasts as long as the
    store waits (a newer round ends it at once), the connections must complete within
    `connect_timeout`, not the collective timeout, and the group's collectives get `timeout`.
    A failure raises `WorkerLostError` where `broken()` says why the round is broken (the
    driver broke it for every member: the others fail too); otherwise torch's error, or the
    store's `RoundSuperseded`, goes on, and this worker exits: a rank that went on to the next
    round alone would leave the others waiting in this round's next collective (a round
    superseded by a leave is not broken)."""
    try:
        group = dist.new_group(backend="gloo", timeout=min(timeout, connect_timeout))
    except (RuntimeError, TimeoutError, ElasticError) as err:
        reason = broken()
        if reason is None or isinstance(err, WorkerLostError):
            raise
        raise WorkerLostError(f"forming a group of the round's ranks: {reason}") from err
    set_group_timeout(timeout, group)
    return group


def _reset_group_names() -> None:
    """Make the next default group's name "0" in every process, as torch does when a default
    group is destroyed. An `init_process_group` that failed (a peer never came, a newer round
    formed) has taken a name and registered nothing; without this, this process would key its
    rendezvous under "1" while a fresh joiner uses "0", and both would wait forever."""
    if not dist.is_initialized():
        dist.distributed_c10d._world.group_count = 0


def abandon_group() -> None:
    """Drop the current default process group without waiting for it.

    Its NCCL communicators, if any, are aborted first (`abort_nccl`). A collective of the old
    group may still be blocked on a dead or hung peer, and destroying the group would join
    its threads; instead the group object is kept alive (in the
    process-wide context's graveyard) and unregistered, so a new default group can form at
    once. Its threads end when the dead peer's sockets close.
    """
    if not dist.is_initialized():
        return
    group = dist.group.WORLD
    abort_nccl(group)
    context.bury(group)
    dist.destroy_process_group()


def abort_nccl(group: dist.ProcessGroup) -> bool:
    """Abort `group`'s NCCL communicators, if it has any; True if it did.

    A survivor's CUDA stream stays blocked on a collective whose peer died until its
    communicator is aborted (NCCL's guidance: surviving ranks call ncclCommAbort); the next
    round then builds new communicators. Gloo has nothing to abort (its blocked collectives
    are left behind, see above)."""
    if not (dist.is_nccl_available() and torch.cuda.is_available()):
        return False
    try:
        backend = group._get_backend(torch.device("cuda"))
    except RuntimeError:
        return False
    if not isinstance(backend, dist.ProcessGroupNCCL):
        return False
    backend.abort()
    return True
