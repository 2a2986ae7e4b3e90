"""A Horovod user's script, only the import changed: a sparse embedding model trained through
`DistributedOptimizer` (sparse gradients allgathered, and `sparse_as_dense`),
`optimizer.synchronize()` followed by `step()` without `skip_synchronize()` (Horovod warns
and reduces again), and Horovod's duplicate-name test. Each rank writes what it saw to
OUTPUT_DIR/rank.N.json. Run by `elasticrun`; `inputs` is what the test uses to compute the
expected weights in one process. Usage: horovod_semantics_job.py OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name

import elastic.torch as hvd

STEPS = 2


def inputs(rank: int, step: int) -> tuple[torch.Tensor, float]:
    """Rank `rank`'s embedding indices at `step` and its loss weight."""
    return torch.tensor([[rank, 2, 4 + rank + step]]), float(rank + 1)


def embedding(seed: int = 0) -> torch.nn.Embedding:
    torch.manual_seed(seed)
    return torch.nn.Embedding(10, 3, sparse=True)


def train_sparse(rank: int, optimizer_kind: str, sparse_as_dense: bool) -> list[list[float]]:
    model = embedding()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if optimizer_kind == "sparse_adam":
        base = torch.optim.SparseAdam(list(model.parameters()), lr=0.1)
    else:
        base = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer = hvd.DistributedOptimizer(base, sparse_as_dense=sparse_as_dense)
    for step in range(STEPS):
        indices, weight = inputs(rank, step)
        optimizer.zero_grad()
        (model(indices).sum() * weight).backward()
        optimizer.step()
        assert model.weight.grad is not None and model.weight.grad.is_sparse
    return model.weight.detach().tolist()


def synchronize_then_step() -> dict[str, object]:
    """Horovod's test_synchronize_step_warning."""
    x = torch.zeros(1, 1).requires_grad_()
    y = torch.ones(1, 1).requires_grad_()
    model = torch.nn.Linear(1, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    return {
        "warnings": [str(w.message) for w in caught],
        "weight": model.weight.item(),
        "bias": model.bias.item(),
    }


def duplicate_name(rank: int) -> list[str]:
    """Horovod's test_horovod_allreduce_duplicate_name_error."""
    tensor = torch.ones(17, 17)
    refused = []
    if rank == 0:
        hvd.allreduce_async(tensor, name="duplicate_name")
        try:
            for _ in range(10):
                hvd.allreduce_async(tensor, name="duplicate_name")
        except ValueError:
            refused.append("rank 0")
    hvd.barrier()
    if rank > 0:
        hvd.allreduce_async(tensor, name="duplicate_name")
        try:
            hvd.allreduce_async(tensor, name="duplicate_name")
        except ValueError:
            refused.append(f"rank {rank}")
    hvd.barrier()
    return refused


def main(out: Path) -> None:
    hvd.init()
    rank = hvd.rank()
    results: dict[str, object] = {"size": hvd.size()}
    for kind in ("sparse_adam", "sgd"):
        for sparse_as_dense in (False, True):
            results[f"{kind}:{sparse_as_dense}"] = train_sparse(rank, kind, sparse_as_dense)
    results["synchronize_then_step"] = synchronize_then_step()
    results["duplicate_name"] = duplicate_name(rank)
    (out / f"rank.{rank}.json").write_text(json.dumps(results))
    hvd.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
