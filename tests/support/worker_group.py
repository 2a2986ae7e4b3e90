"""Run a function in N real worker processes that share a Gloo process group.

Each process creates a Gloo group over a `FileStore`, activates a `WorkerContext` for its rank
and calls the function; `run_group` returns the results in rank order. Processes are forked
from a forkserver that has already imported torch, so a group starts in well under a second.
The function and its arguments must be picklable (module-level functions).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "elastic.worker.context"]


class WorkerGroupError(AssertionError):
    """A rank raised, exited without a result, or the group ran past its timeout."""


def activate_on_one_host(rank: int, size: int, round_: int, group: Any) -> Any:
    """Install (and return) a worker context for `rank` of `size` workers, all on "localhost",
    over `group`. Imports lazily, like the rest of this module, to keep the parent light."""
    import torch

    from elastic.protocol.http import SlotInfo
    from elastic.worker import context

    slot = SlotInfo(
        hostname="localhost",
        rank=rank,
        local_rank=rank,
        cross_rank=0,
        size=size,
        local_size=size,
        cross_size=1,
    )
    ctx = context.WorkerContext(slot=slot, round=round_, group=group, device=torch.device("cpu"))
    context.activate(ctx)
    return ctx


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    size: int,
    store_path: str,
    result_path: str,
    args: tuple[Any, ...],
) -> None:
    import torch
    import torch.distributed as dist

    from elastic.worker import context

    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, size)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=60)
        )
        group = dist.group.WORLD
        assert group is not None
        activate_on_one_host(rank, size, round_=1, group=group)
        outcome: dict[str, Any] = {"result": fn(*args)}
    except BaseException:
        outcome = {"error": traceback.format_exc()}
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(result_path + ".tmp", result_path)
    context.activate(None)
    if dist.is_initialized():
        dist.destroy_process_group()


def run_group(fn: Callable[..., Any], size: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """Call `fn(*args)` on ranks 0..size-1 in separate processes; return their results.

    Raises `WorkerGroupError` with every failing rank's traceback if any rank raises, dies or
    does not finish within `timeout` seconds (the processes are then killed).
    """
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(_PRELOAD)
    workdir = tempfile.mkdtemp(prefix="worker-group-")
    store_path = os.path.join(workdir, "store")
    paths = [os.path.join(workdir, f"rank{r}.pkl") for r in range(size)]
    procs = [
        mp.Process(target=_rank_main, args=(fn, r, size, store_path, paths[r], args))
        for r in range(size)
    ]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        errors = []
        results = []
        for rank, (p, path) in enumerate(zip(procs, paths, strict=True)):
            if p.is_alive():
                errors.append(f"rank {rank}: still running after {timeout} s")
                results.append(None)
                continue
            if not os.path.exists(path):
                errors.append(f"rank {rank}: exited with code {p.exitcode} and no result")
                results.append(None)
                continue
            with open(path, "rb") as f:
                outcome = pickle.load(f)
            if "error" in outcome:
                errors.append(f"rank {rank}:\n{outcome['error']}")
            results.append(outcome.get("result"))
        if errors:
            raise WorkerGroupError("\n".join(errors))
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        shutil.rmtree(workdir, ignore_errors=True)
