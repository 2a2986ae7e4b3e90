"""A worker that calls `hvd.shutdown()` and `hvd.init()` again, many times in one process, as
Horovod's unit tests and notebooks do, checking what a user would check after each `init()`.

Usage: reinit_job.py CYCLES EXPECTED_SIZE

Before the first `init()` it calls `shutdown()` (harmless); it calls `init()` twice in the first
cycle and `shutdown()` twice in the last (both harmless). Each cycle: `init()`; the rank and
size (and the rank variables in `os.environ`); an allreduce, an allgather of rows that differ
per rank, a broadcast from a root that moves each cycle, and a process set added again (its id
restarts at 1: `shutdown()` cleared the sets) with an allreduce on it; `barrier()`;
`shutdown()`; then `is_initialized()` is False and the set is no longer registered. It prints
`cycle C rank R size N ok` per cycle and `cycles done rank R` at the end; a failed check
raises (the worker exits non-zero with its traceback).
"""

from __future__ import annotations

import os
import sys

import torch

import elastic.torch as hvd


def check(what: str, got: object, expected: object) -> None:
    if got != expected:
        raise AssertionError(f"{what}: got {got!r}, expected {expected!r}")


def one_cycle(cycle: int, size: int, init_twice: bool, shutdown_twice: bool) -> int:
    """Run cycle `cycle` of a job of `size` ranks; return this worker's rank in it."""
    hvd.init()
    if init_twice:
        hvd.init()
    check("is_initialized() after init()", hvd.is_initialized(), True)
    rank = hvd.rank()
    check("size()", hvd.size(), size)
    check("rank() in range", 0 <= rank < size, True)
    check("HOROVOD_RANK", os.environ["HOROVOD_RANK"], str(rank))
    total = hvd.allreduce(torch.tensor([float(rank + 1) * (cycle + 1)]), op=hvd.Sum)
    check("allreduce", total.item(), float(size * (size + 1) // 2 * (cycle + 1)))
    rows = hvd.allgather(torch.full((rank + 1, 2), float(rank)))
    expected_rows = [float(r) for r in range(size) for _ in range(r + 1)]
    check("allgather", rows[:, 0].tolist(), expected_rows)
    root = cycle % size
    sent = hvd.broadcast(torch.tensor([float(rank * 10 + cycle)]), root_rank=root)
    check("broadcast", sent.item(), float(root * 10 + cycle))
    pair = hvd.add_process_set([0, 1])
    check("a process set's id after init()", pair.process_set_id, 1)
    if pair.included():
        in_pair = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair)
        check("allreduce on the process set", in_pair.item(), 2.0)
    hvd.barrier()
    hvd.shutdown()
    if shutdown_twice:
        hvd.shutdown()
    check("is_initialized() after shutdown()", hvd.is_initialized(), False)
    check("the set's id after shutdown()", pair.process_set_id, None)
    return rank


def main() -> None:
    cycles, size = int(sys.argv[1]), int(sys.argv[2])
    hvd.shutdown()  # before any init(): harmless
    check("is_initialized() before init()", hvd.is_initialized(), False)
    rank = -1
    for cycle in range(cycles):
        rank = one_cycle(cycle, size, cycle == 0, cycle == cycles - 1)
        print(f"cycle {cycle} rank {rank} size {size} ok", flush=True)
    print(f"cycles done rank {rank}", flush=True)


if __name__ == "__main__":
    main()
