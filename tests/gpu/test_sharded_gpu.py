"""`hvd.elastic.ShardedState` with an FSDP2 model on a GPU, as far as one GPU allows: one rank
over NCCL under `elasticrun` whose process group is formed anew (`shutdown()` then `init()`,
the same rebuild a re-form causes) and whose state must come back bit for bit from its
commit; and two ranks over Gloo whose tensors live on the GPU, losing a rank and taking a
joiner (NCCL refuses two ranks on one GPU, so several ranks share it over Gloo). Skipped
without CUDA.

Not run where this was written (no GPU there): the CPU tests in
tests/e2e/process_groups/test_sharded_state.py and tests/e2e/elastic/test_sharded_job.py
cover the same code over Gloo with CPU tensors. Whether Gloo runs FSDP2's collectives on
CUDA tensors in a given torch build is part of what the second test finds out.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.e2e.process_groups.test_sharded_state import (
    _shrink_then_grow,
    assert_shrink_then_grow,
    free_port,
)
from tests.support.worker_group import run_group

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = """\
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

import elastic.torch as hvd

hvd.init()
dev = torch.device("cuda", hvd.local_rank())
torch.cuda.set_device(dev)


def build(mesh):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 11))
    fully_shard(model[1], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def full(state):
    model_sd, optim_sd = get_state_dict(
        state.model, state.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    flat = {f"model.{k}": v.detach().cpu().clone() for k, v in model_sd.items()}
    for name, values in optim_sd["state"].items():
        for k, v in values.items():
            flat[f"optim.{name}.{k}"] = torch.as_tensor(v).cpu().clone()  # step: a CPU tensor
    return flat


def step(state, seed):
    tokens = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(seed)).to(dev)
    logits = state.model(tokens[:, :-1])
    nn.functional.cross_entropy(logits.reshape(-1, 11), tokens[:, 1:].reshape(-1)).backward()
    state.optimizer.step()
    state.optimizer.zero_grad()


state = hvd.elastic.ShardedState(build, replicas=0, steps=0)
state.sync_if_needed(True)
assert next(state.model.parameters()).device.type == "cuda"
for seed in range(3):
    step(state, seed)
    state.steps += 1
state.commit()
expected = full(state)
step(state, 99)  # lost: after the last commit
state.restore()
hvd.shutdown()
hvd.init()  # a new process group: the state rebuilds the model over the new round's mesh
state.sync_if_needed(False)
after = full(state)
assert state.steps == 3 and sorted(after) == sorted(expected)
for name in expected:
    same = torch.equal(after[name].reshape(-1).view(torch.uint8),
                       expected[name].reshape(-1).view(torch.uint8))
    assert same, name
step(state, 5)
print("sharded on cuda ok", flush=True)
"""


@needs_cuda
def test_one_rank_over_nccl_comes_back_bitwise_from_its_commit_in_a_new_group(
    elasticrun, tmp_path
) -> None:
    script = tmp_path / "sharded_cuda.py"
    script.write_text(SCRIPT)
    job = elasticrun(["-np", "1", "-H", "localhost:1", sys.executable, str(script)])
    assert job.finish(180) == 0, job.output
    assert "sharded on cuda ok" in job.output


@needs_cuda
def test_two_ranks_over_gloo_with_cuda_tensors_reshard_from_a_replica_and_to_a_joiner() -> None:
    results = run_group(_shrink_then_grow, 2, free_port(), "cuda", timeout=180)
    assert_shrink_then_grow(*results)
