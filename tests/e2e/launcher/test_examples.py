"""The shipped examples run under `elasticrun` and learn (their printed loss falls)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLES
from tests.support.processes import processes_naming


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("train_synthetic.py", ["--epochs", "3", "--samples", "2048"]),
        ("train_cnn.py", ["--epochs", "2", "--samples", "512"]),
        ("ddp_elastic.py", ["--epochs", "3", "--samples", "2048"]),
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


@pytest.mark.parametrize("script", ["elastic_train.py", "ddp_elastic.py"])
def test_elastic_example_survives_a_killed_worker(elasticrun, script: str) -> None:
    """DistributedOptimizer's example, and the DDP one (hvd.elastic.DistributedDataParallel)."""
    script = EXAMPLES / script
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", "--failure-scope", "worker",
         "--blacklist-cooldown-range", "60", "60",
         sys.executable, str(script), "--epochs", "4", "--samples", "2048"]
    )  # fmt: skip
    job.wait_for(r"\[0\]<stdout>:epoch 1/4", timeout=120)
    os.kill(_worker_with_rank(script, 1), signal.SIGKILL)
    assert job.finish(180) == 0, job.output
    assert "[0]<stdout>:epoch 4/4" in job.output
    assert "on 1 worker(s)" in job.output


def _worker_with_rank(script: Path, rank: int) -> int:
    """The pid of the worker running `script` that started as `rank` (from its environment)."""
    for pid in processes_naming(str(script)):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"ELASTIC_RANK={rank}".encode() in environ:
                return pid
    raise AssertionError(f"no worker of rank {rank} runs {script}")
