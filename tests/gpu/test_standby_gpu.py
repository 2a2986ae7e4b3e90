"""A warm standby on a GPU host: it holds no CUDA context while it waits (nvidia-smi lists
the worker, never the standby), and the SIGKILLed worker's replacement starts in it and
trains over NCCL on the GPU. One NCCL rank: what one GPU allows. Skipped without CUDA or
nvidia-smi."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.job_status import until

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or shutil.which("nvidia-smi") is None,
    reason="needs a CUDA GPU and nvidia-smi",
)

SCRIPT = """
import os, time, torch
import elastic.torch as hvd
hvd.init()
dev = torch.device("cuda", 0)
model = torch.nn.Linear(64, 1).to(dev)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

@hvd.elastic.run
def train(state):
    while state.step < 400:
        opt.zero_grad()
        model(torch.ones(32, 64, device=dev)).sum().backward()
        opt.step()
        state.step += 1
        if state.step % 10 == 0:
            state.commit()
            print(f"cuda step {state.step} pid={os.getpid()}", flush=True)
        time.sleep(0.05)

train(state)
"""


def gpu_pids() -> set[int]:
    listed = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    return {int(word) for word in listed.split() if word.isdigit()}


def test_a_standby_holds_no_cuda_context_until_a_killed_worker_s_slot_starts_in_it(
    elasticrun, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "run").mkdir()
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    job = elasticrun(
        ["--job-id", "gpustandby", "--standby", "1", "-np", "1", "--min-np", "1",
         "-H", "localhost:1", "--blacklist-cooldown-range", "0", "0", sys.executable,
         str(script)],
        env,
    )  # fmt: skip
    worker = int(job.wait_for(r"cuda step 10 pid=(\d+)", 120).group(1))
    status = until("gpustandby", env, lambda s: any(x.ready for x in s.standbys), "a standby")
    standby = next(s.pid for s in status.standbys if s.ready)
    assert standby is not None
    held = gpu_pids()
    assert worker in held and standby not in held, f"on the GPU: {held}"
    os.kill(worker, signal.SIGKILL)
    job.wait_for(rf"cuda step \d+ pid={standby}", 120)  # the replacement, on the GPU
    assert job.finish(240) == 0, job.transcript()
