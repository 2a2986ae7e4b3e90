"""An MLP on generated regression data, trained data-parallel.

    elasticrun -np 2 python examples/train_synthetic.py --epochs 3

No downloads: the data is generated from a fixed seed, so every run is reproducible.
"""

from __future__ import annotations

import argparse

import torch

import elastic.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    features = torch.randn(args.samples, 32)
    true_weights = torch.randn(32, 1)
    targets = features @ true_weights + 0.1 * torch.randn(args.samples, 1)

    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    # Scale the learning rate by the number of workers, as Horovod recommends.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # Each worker trains on its own shard of the data.
    shard_features = features[hvd.rank() :: hvd.size()]
    shard_targets = targets[hvd.rank() :: hvd.size()]
    for epoch in range(args.epochs):
        order = torch.randperm(len(shard_features), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(1)
        for start in range(0, len(order), args.batch_size):
            batch = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(shard_features[batch]), shard_targets[batch])
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(batch)
        mean_loss = hvd.allreduce(total, op=hvd.Sum).item() / args.samples
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
