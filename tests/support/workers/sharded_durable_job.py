"""An FSDP2 job under `elasticrun` whose hosts can be lost all but one at once.

A tiny language model sharded with `fully_shard` over each round's mesh, in a
`hvd.elastic.ShardedState` with `replicas=1`; durable checkpoints go to the launcher's
`--checkpoint-dir`. It commits every `--commit-every` steps and prints one line per step
(`step N size S host H`). Before each commit it waits for the checkpoint in flight, so that
every commit is checkpointed (a commit whose checkpoint would find one in flight skips it).
With `--lose-at-step K --lose-hosts A,B`, the workers on those
hosts wait at step K for the checkpoint in flight to be written (so the test knows which is
the newest) and SIGKILL themselves, once: a file in `--out` remembers it. Usage:

sharded_durable_job.py --out DIR --steps N [--commit-every C] [--lose-at-step K --lose-hosts A,B]
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import torch
from tiny_lm import VOCAB, build  # this script's folder is first on its path
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--lose-at-step", type=int, default=-1)
    parser.add_argument("--lose-hosts", default="")
    args = parser.parse_args()

    import elastic.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    host = os.environ["ELASTIC_HOSTNAME"]
    state = hvd.elastic.ShardedState(build, replicas=1, steps=0)
    lost_once = args.out / f"lost-{host}"

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.steps < args.steps:
            gen = torch.Generator().manual_seed(state.steps * 100 + hvd.rank())
            tokens = torch.randint(0, VOCAB, (4, 6), generator=gen)
            logits = state.model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.steps += 1
            print(f"step {state.steps} size {hvd.size()} host {host}", flush=True)
            if state.steps % args.commit_every == 0:
                assert state.durable_checkpoints is not None, "run with --checkpoint-dir"
                state.durable_checkpoints.wait(60)
                state.commit()
            if state.steps == args.lose_at_step and not lost_once.exists():
                state.durable_checkpoints.wait(60)  # every rank: the newest is finished
                if host in args.lose_hosts.split(","):
                    lost_once.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                # The survivors meet the loss in the runtime's own collective, which raises
                # WorkerLostError (FSDP's all-gather of the next step would raise Gloo's
                # RuntimeError, which this job does not turn into one).
                hvd.allreduce(torch.zeros(1), name="lose")

    train(state)
    print(f"done steps {state.steps} host {host}", flush=True)


if __name__ == "__main__":
    main()
