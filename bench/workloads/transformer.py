"""The sharded recovery benchmark's model: a small decoder-only transformer language model on
synthetic tokens, sharded with FSDP2 (`fully_shard` on each block, then on the root).

Both workloads (`sharded_elastic.py` under elasticrun, `sharded_torchrun.py` under torchrun)
build it the same way from the same flags (`add_model_args`), so that they train the same
model on the same tokens: `--dim 768 --layers 12 --vocab 8192` is about 98M parameters (the
published configuration), the defaults a few million, `--dim 32 --layers 1 --vocab 64` a toy.
Each step a rank trains on `--batch` sequences of `--seq` tokens, drawn from a generator
seeded with the step and the rank, so a resumed job draws the same tokens again.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

LR = 1e-4


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model's size and each step's batch, shared by both workloads."""
    parser.add_argument("--dim", type=int, default=256, help="model width (default 256)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--vocab", type=int, default=4096, help="tokens (default 4096)")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank and step")


def parameter_count(dim: int, layers: int, vocab: int) -> int:
    """The model's parameters for these flags (without building it)."""
    block = 12 * dim * dim + 13 * dim  # qkv + proj + 4x MLP, their biases, two norms
    return 2 * vocab * dim + layers * block + 2 * dim  # embedding, head, final norm


class Block(nn.Module):
    """Pre-norm self-attention (causal) and a 4x MLP, each with a residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.heads = max(1, dim // 64)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        shape = (batch, seq, self.heads, dim // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class LanguageModel(nn.Module):
    def __init__(self, dim: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(args: argparse.Namespace, mesh: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model sharded over `mesh` (FSDP2: each block, then the root) and its Adam; the
    same initial weights on every rank and in every round (seeded). Uses no collective."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = LanguageModel(args.dim, args.layers, args.vocab)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace, step: int,
    rank: int,
) -> float:  # fmt: skip
    """One step of next-token prediction on this rank's tokens for `step`; the loss."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
    tokens = tokens.to(model.head.weight.device)  # a GPU's, where the model is on one
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The bytes of this rank's share of the state: its local rows of every parameter and of
    every optimizer state tensor sharded with it (Adam's moments; not its step counts)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
        for value in optimizer.state.get(param, {}).values():
            if isinstance(value, DTensor):
                value = value.to_local()
                total += value.numel() * value.element_size()
    return total
