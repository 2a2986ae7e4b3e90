"""A small CNN on synthetic 28x28 images of ten classes, trained data-parallel.

    elasticrun -np 2 python examples/train_cnn.py --epochs 2

The images are generated: each class is a fixed random pattern plus noise, so the network
can learn it and the loss falls; nothing is downloaded.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import elastic.torch as hvd


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Linear(32 * 7 * 7, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


def synthetic_images(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    images = patterns[labels] + 0.8 * torch.randn(samples, 1, 28, 28, generator=generator)
    return images, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    images, labels = synthetic_images(args.samples, seed=7)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression
    )

    mine = torch.arange(hvd.rank(), args.samples, hvd.size())
    for epoch in range(args.epochs):
        stats = torch.zeros(3)  # loss sum, correct, count
        for start in range(0, len(mine), args.batch_size):
            batch = mine[start : start + args.batch_size]
            optimizer.zero_grad()
            logits = model(images[batch])
            loss = nn.functional.cross_entropy(logits, labels[batch])
            loss.backward()
            optimizer.step()
            correct = (logits.argmax(1) == labels[batch]).sum()
            stats += torch.stack([loss.detach() * len(batch), correct, torch.tensor(len(batch))])
        loss_sum, correct, count = hvd.allreduce(stats, op=hvd.Sum).tolist()
        if hvd.rank() == 0:
            print(
                f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / count:.4f} "
                f"accuracy {correct / count:.3f}",
                flush=True,
            )
    hvd.shutdown()


if __name__ == "__main__":
    main()
