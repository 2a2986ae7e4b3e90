"""The shipped examples run under `elasticrun` and learn (their printed loss falls)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("train_synthetic.py", ["--epochs", "3", "--samples", "2048"]),
        ("train_cnn.py", ["--epochs", "2", "--samples", "512"]),
    ],
)
def test_example_trains_and_rank0_reports_a_falling_loss(
    elasticrun, script: str, args: list[str]
) -> None:
    job = elasticrun(["-np", "2", sys.executable, str(EXAMPLES / script), *args])
    assert job.finish(180) == 0, job.output
    losses = [
        float(m.group(1))
        for m in re.finditer(r"\[0\]<stdout>:epoch \d+/\d+: loss (\S+)", job.output)
    ]
    assert len(losses) == int(args[1])
    assert losses[-1] < losses[0]
    assert "[1]<stdout>:epoch" not in job.output, "only rank 0 prints"
