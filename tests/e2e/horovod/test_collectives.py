"""Every collective through `elasticrun` with real worker processes, checked numerically
against a single-process computation, on one host and on two local host names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import WORKERS
from tests.support.workers.collectives_job import inputs

JOB = WORKERS / "collectives_job.py"


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
        pytest.param(
            2, "localhost:2", [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)], marks=pytest.mark.slow
        ),
        pytest.param(
            2,
            "localhost:1,127.0.0.1:1",
            [(0, 2, 0, 1, 0, 2), (1, 2, 0, 1, 1, 2)],
            marks=pytest.mark.slow,
        ),
        pytest.param(3, "localhost:3", None, marks=pytest.mark.slow),
        (
            3,
            "localhost:2,127.0.0.1:1",
            [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1), (2, 3, 0, 1, 1, 2)],
        ),  # fmt: skip
        pytest.param(4, "localhost:2,127.0.0.1:2", None, marks=pytest.mark.slow),
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


SEMANTICS_JOB = WORKERS / "horovod_semantics_job.py"


def _sparse_reference(size: int, optimizer_kind: str) -> torch.Tensor:
    """The sparse embedding trained in one process on the ranks' averaged gradients."""
    from tests.support.workers.horovod_semantics_job import STEPS, embedding, inputs

    model = embedding()
    if optimizer_kind == "sparse_adam":
        optimizer = torch.optim.SparseAdam(list(model.parameters()), lr=0.1)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        grads = []
        for rank in range(size):
            model.zero_grad()
            indices, weight = inputs(rank, step)
            (model(indices).sum() * weight).backward()
            grads.append(model.weight.grad)
        model.weight.grad = (sum(g.to_dense() for g in grads) / size).to_sparse(1)
        optimizer.step()
    return model.weight.detach()


@pytest.mark.parametrize("np", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_horovod_scripts_with_sparse_gradients_synchronize_and_names_finish(
    elasticrun, tmp_path: Path, np: int
) -> None:
    """Issue 27: a sparse embedding through DistributedOptimizer, synchronize() then step()
    without skip_synchronize(), and Horovod's duplicate-name test, as a Horovod user's
    script runs them under `elasticrun`: results, Horovod's warning and errors, no hang."""
    job = elasticrun(
        ["-np", str(np), "--collective-timeout", "60", sys.executable, str(SEMANTICS_JOB),
         str(tmp_path)]
    )  # fmt: skip
    assert job.finish(240) == 0, job.output
    got = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(np)]
    for kind in ("sparse_adam", "sgd"):
        expected = _sparse_reference(np, kind)
        for sparse_as_dense in (False, True):
            for rank in range(np):
                torch.testing.assert_close(
                    torch.tensor(got[rank][f"{kind}:{sparse_as_dense}"]),
                    expected,
                    msg=lambda m, k=kind, d=sparse_as_dense, r=rank: f"{k} {d} rank {r}: {m}",
                )
    for rank in range(np):
        stepped = got[rank]["synchronize_then_step"]
        assert len(stepped["warnings"]) == 1, stepped["warnings"]
        assert (
            "optimizer.step() called without optimizer.skip_synchronize()"
            in (stepped["warnings"][0])
        )
        assert stepped == got[0]["synchronize_then_step"]
        assert got[rank]["duplicate_name"] == [f"rank {rank}"]
