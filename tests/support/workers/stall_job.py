"""A job whose round stalls: after `--steps` training steps in a round of 4, rank 1 sleeps
outside any collective and rank 2 issues an allgather while ranks 0 and 3 issue an
allreduce. In a smaller round (after the ranks behind were failed) it trains `--steps`
steps and ends.

Prints `joined rank=R size=N pid=P` after `hvd.init()`, `stalling rank=R` where it stalls,
`done rank=R size=N` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import elastic.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    print(f"joined rank={hvd.rank()} size={hvd.size()} pid={os.getpid()}", flush=True)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for _ in range(args.steps):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
        state.commit()
        if hvd.size() == 4:
            print(f"stalling rank={hvd.rank()}", flush=True)
            if hvd.rank() == 1:
                time.sleep(3600)  # not in a collective
            elif hvd.rank() == 2:
                hvd.allgather(torch.ones(1))  # another collective than the others'
            else:
                hvd.allreduce(torch.ones(1))

    train(state)
    print(f"done rank={hvd.rank()} size={hvd.size()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
