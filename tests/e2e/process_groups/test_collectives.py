"""Collectives in real Gloo groups of 1, 2 and 3 processes, checked against one-process math."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import elastic.torch as hvd
from elastic.worker.collectives.compression import Compression
from elastic.worker.context import NotInitializedError, current
from elastic.worker.errors import CollectiveArgumentError
from tests.support.worker_group import run_group

OPS = {"average": hvd.Average, "sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max, "prod": hvd.Product}


def _float(rank: int) -> torch.Tensor:
    return torch.arange(12, dtype=torch.float32).view(3, 4) * 0.25 + rank + 1


def _int(rank: int) -> torch.Tensor:
    return torch.tensor([3 * rank - 4, 7, rank - 5, rank, 11], dtype=torch.int64)


def _double(rank: int) -> torch.Tensor:
    return torch.randn(2, 3, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)


def _gather_rows(rank: int) -> torch.Tensor:
    rows = [2, 0, 3][rank % 3]
    return torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) + 100 * rank


def _send_splits(rank: int, size: int) -> list[int]:
    return [(rank + peer) % 3 for peer in range(size)]


def _a2a_input(rank: int, size: int) -> torch.Tensor:
    rows = sum(_send_splits(rank, size))
    return torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) + 1000 * rank


def _wait_poll(handle: hvd.Handle) -> bool:
    deadline = time.monotonic() + 30
    while not hvd.poll(handle):
        assert time.monotonic() < deadline, "poll() never became True"
        time.sleep(0.001)
    return True


def _suite() -> dict[str, Any]:
    """Runs in every rank; returns results keyed like `_expected`."""
    ctx = current("test")
    rank, size = ctx.rank, ctx.size
    root = size - 1
    out: dict[str, Any] = {}
    x, i, d = _float(rank), _int(rank), _double(rank)
    for name, op in OPS.items():
        out[f"f_{name}"] = hvd.allreduce(x, op=op)
        out[f"i_{name}"] = hvd.allreduce(i, op=op)
    out["f_default"] = hvd.allreduce(x)
    out["f_average_false"] = hvd.allreduce(x, average=False)
    out["f_scaled_average"] = hvd.allreduce(x, prescale_factor=0.5, postscale_factor=3.0)
    out["f_scaled_sum"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    out["i_scaled_sum"] = hvd.allreduce(i, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)
    out["f_fp16"] = hvd.allreduce(x, compression=Compression.fp16)
    out["f_unchanged"] = torch.equal(x, _float(rank))

    y = _float(rank)
    out["inplace_is_same"] = hvd.allreduce_(y, op=hvd.Sum) is y
    out["f_inplace_sum"] = y
    noncontig = _float(rank).t()
    hvd.allreduce_(noncontig, op=hvd.Sum)
    out["f_inplace_noncontig_sum"] = noncontig.t()

    handle = hvd.allreduce_async(x, op=hvd.Max)
    out["poll"] = _wait_poll(handle)
    out["f_async_max"] = hvd.synchronize(handle)
    out["sync_twice_same"] = hvd.synchronize(handle) is out["f_async_max"]
    z = _float(rank)
    out["f_async_inplace_sum"] = hvd.synchronize(hvd.allreduce_async_(z, op=hvd.Sum))
    out["async_inplace_is_same"] = out["f_async_inplace_sum"] is z

    out["grouped"] = hvd.grouped_allreduce([x, i, d, x[0]], op=hvd.Sum)
    out["grouped_average"] = hvd.synchronize(hvd.grouped_allreduce_async([x, d]))
    g = [_float(rank), _int(rank)]
    hvd.grouped_allreduce_(g, op=hvd.Sum)
    out["grouped_inplace"] = g
    g2 = [_double(rank)]
    hvd.synchronize(hvd.grouped_allreduce_async_(g2, op=hvd.Min))
    out["grouped_async_inplace_min"] = g2

    out["gather"] = hvd.allgather(_gather_rows(rank))
    out["gather_int"] = hvd.synchronize(hvd.allgather_async(_int(rank)))

    src = _float(rank)
    out["bcast"] = hvd.broadcast(src, root_rank=root)
    out["bcast_src_unchanged"] = torch.equal(src, _float(rank))
    b = _int(rank)
    hvd.broadcast_(b, root_rank=root)
    out["bcast_inplace"] = b
    out["bcast_async"] = hvd.synchronize(hvd.broadcast_async(_double(rank), root))
    b2 = _double(rank)
    out["bcast_async_inplace_same"] = hvd.synchronize(hvd.broadcast_async_(b2, root)) is b2
    out["bcast_async_inplace"] = b2

    splits = _send_splits(rank, size)
    a2a_out, a2a_recv = hvd.alltoall(_a2a_input(rank, size), splits=splits)
    out["a2a"], out["a2a_recv"] = a2a_out, a2a_recv
    t_out, t_recv = hvd.alltoall(_a2a_input(rank, size), splits=torch.tensor(splits))
    out["a2a_tensor_splits_dtype"] = t_recv.dtype
    out["a2a_even"] = hvd.alltoall(torch.arange(2 * size) + 10 * rank)
    out["a2a_async"] = hvd.synchronize(hvd.alltoall_async(torch.arange(2 * size) + 10 * rank))

    out["object"] = hvd.broadcast_object({"from": rank, "payload": list(range(rank + 3))}, root)
    out["objects"] = hvd.allgather_object(("rank", rank, "x" * rank))
    hvd.barrier()

    leaf = _float(rank).requires_grad_()
    (hvd.allreduce(leaf, op=hvd.Sum) * 2).sum().backward()
    out["grad_allreduce"] = leaf.grad
    leaf2 = _gather_rows(rank).requires_grad_()
    hvd.allgather(leaf2).sum().backward()
    out["grad_allgather"] = leaf2.grad

    try:
        hvd.allgather(torch.zeros(2, 3 + rank % 2))
        out["mismatch_error"] = None
    except CollectiveArgumentError as e:
        out["mismatch_error"] = str(e)
    try:
        hvd.alltoall(torch.zeros(4), splits=[5] * size)
        out["splits_error"] = None
    except CollectiveArgumentError as e:
        out["splits_error"] = str(e)
    out["after_errors"] = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    return out


def _expected(rank: int, size: int) -> dict[str, Any]:
    root = size - 1
    ranks = range(size)
    xs = torch.stack([_float(r) for r in ranks])
    ints = torch.stack([_int(r) for r in ranks])
    ds = torch.stack([_double(r) for r in ranks])
    exp: dict[str, Any] = {}
    for name, stack in (("f", xs), ("i", ints)):
        exp[f"{name}_sum"] = stack.sum(0)
        exp[f"{name}_min"] = stack.amin(0)
        exp[f"{name}_max"] = stack.amax(0)
        exp[f"{name}_prod"] = stack.prod(0)
    exp["f_average"] = xs.sum(0) / size
    exp["i_average"] = torch.div(ints.sum(0), size, rounding_mode="floor")
    exp["f_default"] = exp["f_average"]
    exp["f_average_false"] = exp["f_sum"]
    exp["f_scaled_average"] = (xs * 0.5).sum(0) * 3.0 / size
    exp["f_scaled_sum"] = (xs * 0.5).sum(0) * 3.0
    exp["i_scaled_sum"] = (ints * 2).sum(0) * 3
    exp["f_fp16"] = xs.half().sum(0).float() / size
    exp["f_unchanged"] = True
    exp["inplace_is_same"] = True
    exp["f_inplace_sum"] = exp["f_sum"]
    exp["f_inplace_noncontig_sum"] = exp["f_sum"]
    exp["poll"] = True
    exp["f_async_max"] = exp["f_max"]
    exp["sync_twice_same"] = True
    exp["f_async_inplace_sum"] = exp["f_sum"]
    exp["async_inplace_is_same"] = True
    exp["grouped"] = [exp["f_sum"], exp["i_sum"], ds.sum(0), exp["f_sum"][0]]
    exp["grouped_average"] = [exp["f_average"], ds.sum(0) / size]
    exp["grouped_inplace"] = [exp["f_sum"], exp["i_sum"]]
    exp["grouped_async_inplace_min"] = [ds.amin(0)]
    exp["gather"] = torch.cat([_gather_rows(r) for r in ranks])
    exp["gather_int"] = torch.cat([_int(r) for r in ranks])
    exp["bcast"] = _float(root)
    exp["bcast_src_unchanged"] = True
    exp["bcast_inplace"] = _int(root)
    exp["bcast_async"] = _double(root)
    exp["bcast_async_inplace_same"] = True
    exp["bcast_async_inplace"] = _double(root)
    pieces, recv = [], []
    for peer in ranks:
        peer_splits = _send_splits(peer, size)
        start = sum(peer_splits[:rank])
        pieces.append(_a2a_input(peer, size)[start : start + peer_splits[rank]])
        recv.append(peer_splits[rank])
    exp["a2a"] = torch.cat(pieces)
    exp["a2a_recv"] = torch.tensor(recv, dtype=torch.int32)
    exp["a2a_tensor_splits_dtype"] = torch.int64
    even = torch.cat(
        [(torch.arange(2 * size) + 10 * peer)[2 * rank : 2 * rank + 2] for peer in ranks]
    )
    exp["a2a_even"] = even
    exp["a2a_async"] = (even, torch.tensor([2] * size, dtype=torch.int32))
    exp["object"] = {"from": root, "payload": list(range(root + 3))}
    exp["objects"] = [("rank", r, "x" * r) for r in ranks]
    exp["grad_allreduce"] = torch.full((3, 4), 2.0 * size)
    exp["grad_allgather"] = torch.ones_like(_gather_rows(rank))
    exp["mismatch_error"] = None if size == 1 else "differ"
    exp["splits_error"] = "splits"
    exp["after_errors"] = torch.full((2,), float(size))
    return exp


def _check(actual: Any, expected: Any, key: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), key
        assert actual.dtype == expected.dtype, (key, actual.dtype, expected.dtype)
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{key}: {m}")
    elif isinstance(expected, list | tuple) and expected and isinstance(expected[0], torch.Tensor):
        assert len(actual) == len(expected), key
        for n, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _check(a, e, f"{key}[{n}]")
    elif key.endswith("_error") and expected is not None:
        assert actual is not None and expected in actual, (key, actual)
    else:
        assert actual == expected, (key, actual, expected)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_collectives_match_single_process_math(size: int) -> None:
    results = run_group(_suite, size)
    for rank, result in enumerate(results):
        expected = _expected(rank, size)
        assert result.keys() == expected.keys()
        for key, value in expected.items():
            _check(result[key], value, f"rank {rank} {key}")


PUBLIC_CALLS = {
    "allreduce": lambda: hvd.allreduce(torch.ones(1)),
    "allreduce_": lambda: hvd.allreduce_(torch.ones(1)),
    "allreduce_async": lambda: hvd.allreduce_async(torch.ones(1)),
    "allreduce_async_": lambda: hvd.allreduce_async_(torch.ones(1)),
    "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(1)]),
    "grouped_allreduce_": lambda: hvd.grouped_allreduce_([torch.ones(1)]),
    "grouped_allreduce_async": lambda: hvd.grouped_allreduce_async([torch.ones(1)]),
    "grouped_allreduce_async_": lambda: hvd.grouped_allreduce_async_([torch.ones(1)]),
    "allgather": lambda: hvd.allgather(torch.ones(1)),
    "allgather_async": lambda: hvd.allgather_async(torch.ones(1)),
    "broadcast": lambda: hvd.broadcast(torch.ones(1), 0),
    "broadcast_": lambda: hvd.broadcast_(torch.ones(1), 0),
    "broadcast_async": lambda: hvd.broadcast_async(torch.ones(1), 0),
    "broadcast_async_": lambda: hvd.broadcast_async_(torch.ones(1), 0),
    "alltoall": lambda: hvd.alltoall(torch.ones(1)),
    "alltoall_async": lambda: hvd.alltoall_async(torch.ones(1)),
    "broadcast_object": lambda: hvd.broadcast_object(1),
    "allgather_object": lambda: hvd.allgather_object(1),
    "barrier": hvd.barrier,
    "synchronize": lambda: hvd.synchronize(hvd.Handle(([], lambda: None))),
    "poll": lambda: hvd.poll(hvd.Handle(([], lambda: None))),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_CALLS))
def test_calls_before_init_raise_not_initialized(name: str) -> None:
    with pytest.raises(NotInitializedError, match=name):
        PUBLIC_CALLS[name]()
