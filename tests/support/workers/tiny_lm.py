"""The tests' FSDP2 model: a tiny language model and the `build(mesh)` a `ShardedState` calls
each round, shared by the sharded worker scripts (which import it as `tiny_lm`, their own
folder being first on their path) and the process-group tests.

VOCAB is 11 rows, which 2, 3, 4 and 5 ranks cannot all share evenly, so every re-form moves
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
