"""Elastic training in Horovod Elastic's style: workers may die, join and leave mid-training.

    elasticrun -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script discovery_scripts/hosts_file.sh \\
        python examples/elastic_train.py --epochs 5

(with `ELASTIC_HOSTS_FILE` naming a file of `host:slots` lines that you edit while it runs).
Kill a worker, add a host or remove one: the others keep training in the same processes,
roll back to their last commit only when a worker died, and the sampler makes sure every
sample of an epoch is trained on exactly once. A killed worker's host leaves with it, as in
horovodrun; with `--failure-scope worker` its host's other workers keep training.
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
    targets = features @ torch.randn(32, 1) + 0.1 * torch.randn(args.samples, 1)

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    dataset = torch.utils.data.TensorDataset(features, targets)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    # This worker's share of the epoch's remaining samples, re-sharded after every reset; the
    # shards are padded to one length, so every worker takes the same number of steps.
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=args.batch_size)
    # Everything a worker needs to resume: commits snapshot it, restores roll it back, and a
    # joining worker receives it from a worker that holds the newest commit.
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            total = torch.zeros(2)
            for step, (inputs, wanted) in enumerate(loader):
                optimizer.zero_grad()
                errors = model(inputs) - wanted
                loss = (errors**2).sum() / (args.batch_size * hvd.size())
                loss.backward()
                optimizer.step()
                # The reported loss leaves out the padding repeat a shard may end with.
                real = ~state.sampler.padding_mask(step, args.batch_size)
                squared = float((errors.detach()[real] ** 2).sum())
                total += torch.tensor([squared, float(real.sum())])
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
