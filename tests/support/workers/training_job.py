"""Data-parallel training with DistributedOptimizer; also the single-process reference.

`train(rank, size, ...)` with size=1 and the whole batch is the reference; under `elasticrun`
each rank trains on its shard of every global batch. Usage:
training_job.py OUTPUT_DIR STEPS COMPRESSION(none|fp16) OPTIMIZER(sgd|adam)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

GLOBAL_BATCH = 12


def model_and_data(seed: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    data = torch.randn(64, GLOBAL_BATCH, 8)
    target = data.sum(-1, keepdim=True).sin()
    torch.manual_seed(seed)  # ranks start from different weights: broadcast must fix that
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, data, target


def make_optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def reference(steps: int, kind: str) -> dict[str, torch.Tensor]:
    model, data, target = model_and_data(seed=0)
    optimizer = make_optimizer(kind, model)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data[step]), target[step]).backward()
        optimizer.step()
    return model.state_dict()


def distributed(out: Path, steps: int, compression: str, kind: str) -> None:
    import elastic.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model, data, target = model_and_data(seed=rank)
    optimizer = make_optimizer(kind, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
    )
    shard = slice(rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size)
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[step][shard]), target[step][shard])
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), out / f"params.{rank}.pt")
    print(f"trained rank={rank}")
    hvd.shutdown()


if __name__ == "__main__":
    distributed(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
