"""Horovod features in real elastic jobs: a usage error is the user's error, not a lost peer
(the job reports it once and stops instead of restoring and re-joining into it again), and a
process set is formed again in the round after a worker dies."""

from __future__ import annotations

import os
import signal
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


PROCESS_SET_SCRIPT = """
import os
import time

import torch
import elastic.torch as hvd

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])  # Horovod's static process sets
print(f"worker pid={os.getpid()} rank={hvd.rank()}", flush=True)
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    while state.step < 40:
        if pair.included():
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair).item()
        else:
            total = 0.0
        world = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
        state.step += 1
        print(f"step {state.step} size {hvd.size()} rank {hvd.rank()} pair {total:g} "
              f"world {world:g}", flush=True)
        state.commit()
        time.sleep(0.05)


train(state)
"""


def test_a_process_set_is_formed_again_after_a_worker_dies(elasticrun, tmp_path: Path) -> None:
    script = tmp_path / "pair.py"
    script.write_text(PROCESS_SET_SCRIPT)
    job = elasticrun(
        ["-np", "3", "--min-np", "2", "-H", "localhost:3", "--failure-scope", "worker",
         sys.executable, str(script)]
    )  # fmt: skip
    victim = int(job.wait_for(r"worker pid=(\d+) rank=1", 120).group(1))
    job.wait_for(r"step 5 size 3 rank 0 pair 2 world 3", 60)
    os.kill(victim, signal.SIGKILL)
    # The survivors are ranks 0 and 1 of the next round: the set [0, 1] is both of them.
    job.wait_for(r"step \d+ size 2 rank 0 pair 2 world 2", 120)
    job.wait_for(r"step \d+ size 2 rank 1 pair 2 world 2", 60)
    assert job.finish(120) == 0, job.output
