"""The NCCL path on real GPUs: collectives on CUDA tensors, aborting communicators, and a
rank killed mid-allreduce. Skipped without CUDA (and the two-rank test without two GPUs:
NCCL refuses two ranks on one GPU)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import pytest
import torch

from tests.support.paths import WORKERS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL: one rank per GPU)"
)

JOB = WORKERS / "gpu_job.py"


@needs_cuda
def test_collectives_on_cuda_tensors_over_nccl_match_cpu_math(elasticrun, tmp_path) -> None:
    script = tmp_path / "cuda_collectives.py"
    script.write_text(
        "import torch\n"
        "import elastic.torch as hvd\n"
        "hvd.init()\n"
        "dev = torch.device('cuda', 0)\n"
        "for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16,"
        " torch.uint8, torch.bool):\n"
        "    t = torch.tensor([1, 0, 1, 1], dtype=dtype, device=dev)\n"
        "    assert torch.equal(hvd.allreduce(t, op=hvd.Sum).cpu(), t.cpu()), dtype\n"
        "    assert torch.equal(hvd.broadcast(t, 0).cpu(), t.cpu()), dtype\n"
        "    assert torch.equal(hvd.allgather(t).cpu(), t.cpu()), dtype\n"
        "model = torch.nn.Linear(4, 1).to(dev)\n"
        "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "model(torch.ones(2, 4, device=dev)).sum().backward()\n"
        "opt.step()\n"
        "print('cuda collectives ok', flush=True)\n"
    )
    job = elasticrun(["-np", "1", "-H", "localhost:1", sys.executable, str(script)])
    assert job.finish(180) == 0, job.output
    assert "cuda collectives ok" in job.output


def _abort_and_reform() -> tuple[bool, float]:
    import torch.distributed as dist

    from elastic.worker.group.process_group import abort_nccl

    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(
            "cuda:nccl,cpu:gloo", store=store, rank=0, world_size=1,
            timeout=timedelta(seconds=30), device_id=torch.device("cuda", 0),
        )  # fmt: skip
        t = torch.ones(8, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        aborted = abort_nccl(dist.group.WORLD)
        dist.destroy_process_group()
        store2 = dist.FileStore(os.path.join(tmp, "store2"), 1)
        dist.init_process_group("cuda:nccl,cpu:gloo", store=store2, rank=0, world_size=1)
        u = torch.full((8,), 2.0, device="cuda")
        dist.all_reduce(u)
        torch.cuda.synchronize()
        value = u[0].item()
        dist.destroy_process_group()
    return aborted, value


@needs_cuda
def test_a_groups_nccl_communicators_are_aborted_and_a_new_group_works() -> None:
    aborted, value = _abort_and_reform()
    assert aborted is True
    assert value == 2.0


@needs_two_gpus
def test_a_rank_killed_mid_allreduce_leaves_the_survivor_stepping(elasticrun) -> None:
    """Rank 1 is SIGKILLed while the ranks allreduce 256 MB per step: rank 0's NCCL stream
    is released (its communicator aborted), the job re-forms at size 1 and steps on."""
    job = elasticrun(["-np", "2", "--min-np", "1", "-H", "localhost:2", sys.executable, str(JOB)])
    victim = int(job.wait_for(r"worker pid=(\d+) rank=1", 180).group(1))
    job.wait_for(r"step 5 size 2 rank 0", 120)
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    job.wait_for(r"step \d+ size 1 rank 0", 60)
    print(f"survivor's first step after the kill: {time.monotonic() - started:.2f} s")
