"""The tests' FSDP2 model: a tiny language model and the `build(mesh)` a `ShardedState` calls
each round, shared by the sharded worker scripts (which import it as `tiny_lm`, their own
folder being first on their path) and the process-group tests.

`train_step` is the sharded jobs' step, counting the samples it trains for their exactly-once
checks. VOCAB is 11 rows, which 2, 3, 4 and 5 ranks cannot all share evenly, so every re-form moves
rows between uneven shards."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB, WIDTH, HIDDEN = 11, 6, 7


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.block = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        return self.head(self.norm(hidden + self.block(hidden)))


def build(mesh: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The user's part: the same model on every rank, sharded over the round's mesh."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLM()
    fully_shard(model.block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(state: Any, tokens: torch.Tensor, idx: torch.Tensor, k: int, batch: int) -> None:
    """One step of `state` (a `ShardedState` with `sampler`, `counts` and `step`) on the
    sampler's batch `k` (`idx`, of `batch` indices into `tokens`): forward, backward, the
    optimizer's step, then every rank's samples counted (padding repeats are not) and the
    batch recorded. A collective."""
    import elastic.torch as hvd

    sample = tokens[idx]
    logits = state.model(sample[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), sample[:, 1:].reshape(-1))
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()
    seen = torch.zeros(len(tokens))
    seen[idx[~state.sampler.padding_mask(k, batch)]] = 1.0
    hvd.allreduce_(seen, op=hvd.Sum)
    state.counts += seen
    state.sampler.record_batch(k, batch)
    state.step += 1
