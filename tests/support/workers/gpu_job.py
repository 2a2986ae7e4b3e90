"""A small elastic job on CUDA tensors (NCCL between GPUs): each step allreduces a large
gradient-sized tensor and checks it, so a peer killed mid-step leaves survivors blocked in
NCCL until their communicators are aborted. Prints
`worker pid=P rank=R`, `step S size N rank R` and `done`."""

from __future__ import annotations

import argparse
import os

import torch

import elastic.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--numel", type=int, default=64 * 1024 * 1024)
    args = parser.parse_args()
    hvd.init()
    print(f"worker pid={os.getpid()} rank={hvd.rank()}", flush=True)
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    state = hvd.elastic.ObjectState(step=0)
    payload = torch.ones(args.numel, device=device)

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> None:
        while state.step < args.steps:
            total = hvd.allreduce(payload, op=hvd.Sum)
            assert total[0].item() == hvd.size(), (total[0].item(), hvd.size())
            state.step += 1
            print(f"step {state.step} size {hvd.size()} rank {hvd.rank()}", flush=True)
            state.commit()

    train(state)
    print(f"done size {hvd.size()} rank {hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
