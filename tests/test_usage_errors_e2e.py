"""A usage error in an elastic job is the user's error, not a lost peer: the job reports it
once and stops, instead of restoring and re-joining into the same error."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = """
import torch
import elastic.torch as hvd

hvd.init()
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} enters train", flush=True)
    total = hvd.allreduce(torch.full((3,), hvd.rank() + 1, dtype=torch.int16), op=hvd.Sum)
    print(f"rank {hvd.rank()} int16 sum {total.tolist()}", flush=True)
    hvd.allreduce(torch.ones(2 + hvd.rank()))


train(state)
"""


def test_a_mismatched_collective_ends_the_job_with_one_clear_error(
    elasticrun, tmp_path: Path
) -> None:
    script = tmp_path / "mismatch.py"
    script.write_text(SCRIPT)
    job = elasticrun(["-np", "2", "-H", "localhost:2", sys.executable, str(script)])
    assert job.finish(120) != 0
    output = job.output
    assert "rank 0 int16 sum [3, 3, 3]" in output and "rank 1 int16 sum [3, 3, 3]" in output
    assert "CollectiveArgumentError" in output
    assert "the ranks' tensors differ in shape (rank 0: [2]; rank 1: [3])" in output
    assert output.count("enters train") == 2, output  # no restore and re-join into it again
    assert "WorkerLostError" not in output
