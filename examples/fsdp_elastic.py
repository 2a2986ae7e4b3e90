"""Elastic training of a model no worker holds whole: FSDP2 (`fully_shard`) under elasticrun.

    elasticrun -np 4 --min-np 2 --max-np 8 \\
        --host-discovery-script discovery_scripts/hosts_file.sh \\
        python examples/fsdp_elastic.py --epochs 5

(with `ELASTIC_HOSTS_FILE` naming a file of `host:slots` lines, on at least two hosts, that
you edit while it runs). A small transformer language model learns synthetic token
sequences (each token is the previous one plus a per-sequence step, modulo the vocabulary).

The script is an ordinary FSDP2 script with its model-building code in one function,
`build(mesh)`, which `hvd.elastic.ShardedState` calls again with each round's mesh: after a
worker dies, a host joins or one leaves, the state rebuilds the model and optimizer for the
new number of workers and moves every shard (parameters and AdamW's moments) to its new
owner, in the same processes, from the last commit, which each worker replicated in host
memory to a worker on another host (`replicas=1`). Training code reads `state.model` and
`state.optimizer` each time it is called: they are new objects after every re-form.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import elastic.torch as hvd


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, length: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(length, width) / math.sqrt(width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="per worker")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
    parser.add_argument("--replicas", type=int, default=1, help="other hosts keeping each shard")
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--length", type=int, default=16)
    args = parser.parse_args()

    hvd.init()
    generator = torch.Generator().manual_seed(1234)
    starts = torch.randint(0, args.vocab, (args.samples, 1), generator=generator)
    steps = torch.randint(1, 4, (args.samples, 1), generator=generator)
    tokens = (starts + steps * torch.arange(args.length + 1)) % args.vocab

    def build(mesh):
        """Called by the state at the start and after every re-form, with that round's mesh
        (all of its workers, 1-D): the same model on every worker, sharded over `mesh`."""
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = TinyLM(args.vocab, width=64, layers=2, heads=4, length=args.length)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=3e-3)

    sampler = hvd.elastic.ElasticSampler(range(args.samples), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(
        range(args.samples), sampler=sampler, batch_size=args.batch_size
    )
    state = hvd.elastic.ShardedState(build, replicas=args.replicas, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.ShardedState) -> None:
        while state.epoch < args.epochs:
            total = torch.zeros(2)
            for step, indices in enumerate(loader):
                batch = tokens[indices]
                logits = state.model(batch[:, :-1])  # read each time: new after a re-form
                loss = nn.functional.cross_entropy(
                    logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1)
                )
                loss.backward()  # FSDP2 reduce-scatters the gradients over the round's workers
                state.optimizer.step()
                state.optimizer.zero_grad()
                real = ~state.sampler.padding_mask(step, args.batch_size)  # no padding repeat
                total += torch.tensor([float(loss.detach()) * int(real.sum()), float(real.sum())])
                state.sampler.record_batch(step, args.batch_size)
                if (step + 1) % args.commit_every == 0:
                    state.commit()  # replicated in the background; where changes are picked up
            loss_sum, count = hvd.allreduce(total, op=hvd.Sum).tolist()
            if hvd.rank() == 0:
                print(
                    f"epoch {state.epoch + 1}/{args.epochs}: loss {loss_sum / max(count, 1):.4f} "
                    f"on {hvd.size()} worker(s)",
                    flush=True,
                )
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    hvd.shutdown()


if __name__ == "__main__":
    main()
