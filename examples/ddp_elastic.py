"""Elastic training of a `DistributedDataParallel` model: workers may die, join and leave.

    elasticrun -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script discovery_scripts/hosts_file.sh \\
        python examples/ddp_elastic.py --epochs 5

(with `ELASTIC_HOSTS_FILE` naming a file of `host:slots` lines that you edit while it runs).
The training step is a plain DDP step (a torch optimizer, `loss.backward()`,
`optimizer.step()`); the one change from a torchrun DDP script is the wrapper,
`hvd.elastic.DistributedDataParallel(module)` instead of
`torch.nn.parallel.DistributedDataParallel(module)`, which rebuilds its DDP over each new
round's process group. Kill a worker, add a host or remove one: the others keep training in
the same processes, roll back to their last commit only when a worker died, and the sampler
makes sure every sample of an epoch is trained on exactly once.
"""

from __future__ import annotations

import argparse

import torch

import elastic.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--commit-every", type=int, default=10, help="batches between commits")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    features = torch.randn(args.samples, 32)
    labels = (features @ torch.randn(32, 4)).argmax(1)  # four classes, learnable

    module = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    )
    # Built here, before training: no collective yet. Its first forward in every round builds
    # a DDP over that round's process group, from rank 0's parameters and buffers.
    model = hvd.elastic.DistributedDataParallel(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # a torch optimizer
    dataset = torch.utils.data.TensorDataset(features, labels)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=args.batch_size)
    # The wrapper goes into the state as the model: commits hold the module's state.
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            total = torch.zeros(2)
            model.train()
            for step, (inputs, wanted) in enumerate(loader):
                optimizer.zero_grad()
                logits = model(inputs)
                loss = torch.nn.functional.cross_entropy(logits, wanted)
                loss.backward()  # DDP averages the gradients over the round's workers
                optimizer.step()
                # The reported loss leaves out the padding repeat a shard may end with.
                real = ~state.sampler.padding_mask(step, args.batch_size)
                each = torch.nn.functional.cross_entropy(logits.detach(), wanted, reduction="none")
                total += torch.tensor([float(each[real].sum()), float(real.sum())])
                state.sampler.record_batch(step, args.batch_size)
                if (step + 1) % args.commit_every == 0:
                    state.commit()  # also where a membership change is picked up
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
