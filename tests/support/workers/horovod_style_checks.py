"""A test suite written the way Horovod's own unit tests are: every test calls `hvd.init()`
first and `tearDown` calls `hvd.barrier()` and `hvd.shutdown()`, so one process runs many
init/shutdown cycles. Only the import differs from a Horovod suite.

Usage: horovod_style_checks.py CHECKS

Runs CHECKS small checks (the kinds below, in turn) with `unittest` and prints, on every rank,
`rank R: checks passed P of CHECKS` (R: the rank of the last check that initialized).
"""

from __future__ import annotations

import sys
import unittest
from collections.abc import Callable

import torch

import elastic.torch as hvd


def allreduce_sum(case: unittest.TestCase) -> None:
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    case.assertEqual(total.item(), hvd.size() * (hvd.size() + 1) / 2)


def allreduce_average(case: unittest.TestCase) -> None:
    mean = hvd.allreduce(torch.full((3,), float(hvd.rank())))
    case.assertEqual(mean.tolist(), [(hvd.size() - 1) / 2] * 3)


def allgather_rows(case: unittest.TestCase) -> None:
    rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())))
    case.assertEqual(rows.shape[0], hvd.size() * (hvd.size() + 1) // 2)


def broadcast_root(case: unittest.TestCase) -> None:
    root = hvd.size() - 1
    got = hvd.broadcast(torch.tensor([float(hvd.rank())]), root_rank=root)
    case.assertEqual(got.item(), float(root))


def broadcast_object(case: unittest.TestCase) -> None:
    got = hvd.broadcast_object({"from": hvd.rank()}, root_rank=0)
    case.assertEqual(got, {"from": 0})


def allgather_object(case: unittest.TestCase) -> None:
    case.assertEqual(hvd.allgather_object(hvd.rank()), list(range(hvd.size())))


def process_set(case: unittest.TestCase) -> None:
    pair = hvd.add_process_set([0, 1])
    case.assertEqual(pair.process_set_id, 1)  # the sets of earlier tests went with shutdown()
    if pair.included():
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair)
        case.assertEqual(total.item(), 2.0)


def grouped_allreduce(case: unittest.TestCase) -> None:
    tensors = [torch.ones(2) * hvd.rank(), torch.ones(3)]
    summed = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    case.assertEqual(summed[1].tolist(), [float(hvd.size())] * 3)


KINDS: list[Callable[[unittest.TestCase], None]] = [
    allreduce_sum,
    allreduce_average,
    allgather_rows,
    broadcast_root,
    broadcast_object,
    allgather_object,
    process_set,
    grouped_allreduce,
]


class HorovodStyleChecks(unittest.TestCase):
    """Each test: `hvd.init()`, one check; `tearDown`: `hvd.barrier()`, `hvd.shutdown()`."""

    last_rank = -1

    def tearDown(self) -> None:
        if hvd.is_initialized():
            HorovodStyleChecks.last_rank = hvd.rank()
            hvd.barrier()
            hvd.shutdown()


def _test(kind: Callable[[unittest.TestCase], None]) -> Callable[[unittest.TestCase], None]:
    def test(self: unittest.TestCase) -> None:
        hvd.init()
        kind(self)

    return test


def main() -> None:
    checks = int(sys.argv[1])
    for n in range(checks):
        kind = KINDS[n % len(KINDS)]
        setattr(HorovodStyleChecks, f"test_{n:04d}_{kind.__name__}", _test(kind))
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(HorovodStyleChecks)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
    failed = {test.id() for test, _ in result.failures + result.errors}  # body or tearDown
    passed = result.testsRun - len(failed)
    print(f"rank {HorovodStyleChecks.last_rank}: checks passed {passed} of {checks}", flush=True)


if __name__ == "__main__":
    main()
