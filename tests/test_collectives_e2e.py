"""Every collective through `elasticrun` with real worker processes, checked numerically
against a single-process computation, on one host and on two local host names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.workers.collectives_job import inputs

JOB = Path(__file__).parent / "workers" / "collectives_job.py"


def expected(size: int) -> dict[str, object]:
    data = [inputs(r, size) for r in range(size)]
    xs = torch.stack([d["x"] for d in data])
    a2a = []
    for dest in range(size):
        for src in range(size):
            splits = data[src]["splits"].tolist()
            start = sum(splits[:dest])
            a2a.append((src, data[src]["a2a"][start : start + splits[dest]]))
    total_sum = xs.sum(0)
    return {
        "average": (total_sum / size).tolist(),
        "sum": total_sum.tolist(),
        "min": xs.min(0).values.tolist(),
        "max": xs.max(0).values.tolist(),
        "product": xs.prod(0).tolist(),
        "scaled": total_sum.tolist(),
        "int_sum": torch.stack([d["i"] for d in data]).sum(0).tolist(),
        "inplace_sum": total_sum.tolist(),
        "grouped": [total_sum.tolist(), (total_sum * 2).tolist()],
        "async_max": xs.max(0).values.tolist(),
        "allgather": torch.cat([d["rows"] for d in data]).tolist(),
        "broadcast": data[size - 1]["b"].tolist(),
        "broadcast_async_inplace": data[0]["b"].tolist(),
        "object": {"from": size - 1, "tag": "root"},
        "objects": [["rank", r] for r in range(size)],
        "_alltoall": [
            torch.cat([chunk for src, chunk in a2a[dest * size : (dest + 1) * size]]).tolist()
            for dest in range(size)
        ],
    }


@pytest.mark.parametrize(
    ("np", "hosts", "coords"),
    [
        (1, "localhost:1", [(0, 1, 0, 1, 0, 1)]),
        (2, "localhost:2", [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]),
        (2, "localhost:1,127.0.0.1:1", [(0, 2, 0, 1, 0, 2), (1, 2, 0, 1, 1, 2)]),
        (3, "localhost:3", None),
        (
            3,
            "localhost:2,127.0.0.1:1",
            [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1), (2, 3, 0, 1, 1, 2)],
        ),  # fmt: skip
        (4, "localhost:2,127.0.0.1:2", None),
    ],
)
def test_collectives_match_a_single_process(
    elasticrun, tmp_path: Path, np: int, hosts: str, coords
) -> None:
    job = elasticrun(["-np", str(np), "-H", hosts, sys.executable, str(JOB), str(tmp_path)])
    assert job.finish(180) == 0, job.output
    want = expected(np)
    for rank in range(np):
        got = json.loads((tmp_path / f"rank.{rank}.json").read_text())
        for key, value in want.items():
            if not key.startswith("_"):
                _check(key, got[key], value, rank)
        _check("alltoall", got["alltoall"], want["_alltoall"][rank], rank)
        assert got["alltoall_splits"] == [data["splits"][rank].item() for data in
                                          (inputs(src, np) for src in range(np))]  # fmt: skip
        if coords is not None:
            assert tuple(got["coords"]) == coords[rank]


def _check(key: str, got: object, want: object, rank: int) -> None:
    if isinstance(want, dict) or key == "objects":
        assert got == want, f"{key} on rank {rank}"
    else:
        torch.testing.assert_close(
            torch.tensor(got, dtype=torch.float64),
            torch.tensor(want, dtype=torch.float64),
            msg=lambda m: f"{key} on rank {rank}: {m}",
        )
