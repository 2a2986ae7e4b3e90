"""`hvd.elastic.DistributedDataParallel` on a GPU over NCCL, as far as one GPU allows: one rank
under `elasticrun` whose process group is formed anew (`shutdown()` then `init()`, the same
rebuild a re-form causes), and the wrapper's device check against the worker's GPU. Skipped
without CUDA. Not run where this was written (no GPU there): the CPU tests in
tests/e2e/process_groups/test_ddp.py and tests/e2e/elastic/test_ddp_job.py cover the same code
over Gloo."""

from __future__ import annotations

import sys

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = """\
import torch
import elastic.torch as hvd

hvd.init()
dev = torch.device("cuda", hvd.local_rank())
try:
    hvd.elastic.DistributedDataParallel(torch.nn.Linear(4, 1).to(dev), device_ids=[dev.index + 1])
except hvd.elastic.UnsupportedModelError as err:
    print("refused:", err, flush=True)
module = torch.nn.Linear(4, 1).to(dev)
model = hvd.elastic.DistributedDataParallel(module, device_ids=[dev.index])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
start = module.weight.detach().clone()


def step():
    optimizer.zero_grad()
    model(torch.ones(2, 4, device=dev)).sum().backward()  # weight's gradient: 2 everywhere
    optimizer.step()


step()
hvd.shutdown()
hvd.init()  # a new process group: the next forward builds a DDP over it
step()
assert torch.allclose(module.weight.detach(), start - 0.4), (module.weight, start)
print("ddp on cuda ok", flush=True)
"""


@needs_cuda
def test_the_wrapper_trains_over_nccl_across_a_new_process_group(elasticrun, tmp_path) -> None:
    script = tmp_path / "ddp_cuda.py"
    script.write_text(SCRIPT)
    job = elasticrun(["-np", "1", "-H", "localhost:1", sys.executable, str(script)])
    assert job.finish(180) == 0, job.output
    assert "refused: hvd.elastic.DistributedDataParallel: device_ids=[1]" in job.output
    assert "ddp on cuda ok" in job.output
