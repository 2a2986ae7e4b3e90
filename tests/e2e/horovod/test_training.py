"""DistributedOptimizer under `elasticrun`: N ranks on shards equal one process on the batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import WORKERS
from tests.support.workers.training_job import GLOBAL_BATCH, reference

JOB = WORKERS / "training_job.py"
STEPS = 10


@pytest.mark.parametrize(
    ("np", "compression", "optimizer", "tolerance"),
    [
        pytest.param(2, "none", "sgd", 1e-5, marks=pytest.mark.slow),
        (3, "none", "adam", 1e-5),
        (2, "fp16", "sgd", 2e-3),
    ],
)
def test_distributed_training_equals_single_process(
    elasticrun, tmp_path: Path, np: int, compression: str, optimizer: str, tolerance: float
) -> None:
    assert GLOBAL_BATCH % np == 0
    args = [sys.executable, str(JOB), str(tmp_path), str(STEPS), compression, optimizer]
    job = elasticrun(["-np", str(np), *args])
    assert job.finish(180) == 0, job.output
    want = reference(STEPS, optimizer)
    start = {k: v.clone() for k, v in reference(0, optimizer).items()}
    for rank in range(np):
        got = torch.load(tmp_path / f"params.{rank}.pt")
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=tolerance, atol=tolerance)
            assert not torch.equal(got[name], start[name]), "training must have moved weights"
