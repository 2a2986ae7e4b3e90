"""The fault soak's FSDP2 job: `soak_job.py`'s contract (step lines, side files, the stop
file, `result.json` with exactly-once counts) with the model sharded by `fully_shard` in a
`hvd.elastic.ShardedState`.

The state keeps `replicas=1` (each rank's shards on one rank of another host) and the
launcher's `--checkpoint-dir` gets a durable checkpoint at every commit: before each commit
every rank waits (up to 10 s) for the checkpoint in flight, so a commit rarely finds one
still being written (one that does is not checkpointed; the job then goes on from an older
one after a loss beyond the replicas, which the counts below still account for). The
counts of how often each sample was trained, the epoch and the sampler are plain values of
the state: they are committed, replicated and checkpointed with the model, so after a
rollback to a commit or a resume from a checkpoint they are those of that commit, and the
samples trained since are trained (and counted) again. At the end each count must equal the
number of epochs. The job commits, and waits for that checkpoint, before its first step: a
loss beyond the replicas with no checkpoint yet would end it (`ShardsLostError`), and one
before the first commit meets the job-start replica check (a bug left open: see
`test_sharded_job.py`'s xfail).

Each step ends with `state.check_host_updates()` (or a commit), so a leaver leaves at a step
boundary. Prints `worker pid=P` at start, `joined rank=R size=N pid=P` after `hvd.init()`,
`step S epoch E size N rank R pid P t T` per step and `done epochs E size N rank R` at the
end; every step line is appended to `--side-dir/<pid>.log` after it is printed. Rank 0
writes `result.json` (counts and epochs) into `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from tiny_lm import VOCAB, build, train_step  # this script's folder is first on its path

import elastic.torch as hvd

SEQ = 6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--side-dir", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--min-epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--commit-every", type=int, default=3)
    parser.add_argument("--step-delay", type=float, default=0.03)
    args = parser.parse_args()

    torch.set_num_threads(1)
    pid = os.getpid()
    print(f"worker pid={pid}", flush=True)
    side = open(Path(args.side_dir, f"{pid}.log"), "a", buffering=1)  # noqa: SIM115
    hvd.init()
    print(f"joined rank={hvd.rank()} size={hvd.size()} pid={pid}", flush=True)
    n, b = args.samples, args.batch
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))
    sampler = hvd.elastic.ElasticSampler(range(n), shuffle=True, seed=1)
    state = hvd.elastic.ShardedState(
        build, replicas=1, sampler=sampler, counts=torch.zeros(n), epoch=0, step=0
    )
    assert state.durable_checkpoints is not None, "run with --checkpoint-dir"
    loader = torch.utils.data.DataLoader(range(n), sampler=sampler, batch_size=b)

    def stop_requested() -> bool:
        """The same answer on every rank: whether any rank sees the stop file."""
        flag = torch.tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
        hvd.allreduce_(flag, op=hvd.Max)
        return bool(flag.item() > 0)

    def commit(state: Any) -> None:
        state.durable_checkpoints.wait(10)  # so that this commit is checkpointed too
        state.commit()

    @hvd.elastic.run
    def train(state: Any) -> None:
        if state.step == 0:  # the same on every rank: a checkpoint before the first step
            commit(state)
        while True:
            # Only between epochs (as soak_job.py): a reset re-enters mid-epoch.
            between = not state.sampler.processed_indices
            if between and state.epoch >= args.min_epochs and stop_requested():
                return
            for k, idx in enumerate(loader):  # padded shards: the same steps on every rank
                train_step(state, tokens, idx, k, b)
                trained_at = time.time()
                line = (
                    f"step {state.step} epoch {state.epoch} size {hvd.size()} rank {hvd.rank()} "
                    f"pid {pid} t {trained_at:.3f}"
                )
                print(line, flush=True)
                side.write(line + "\n")
                time.sleep(args.step_delay)
                if state.step % args.commit_every == 0:
                    commit(state)
                else:
                    state.check_host_updates()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            commit(state)

    train(state)
    if hvd.rank() == 0:
        result = {"counts": state.counts.tolist(), "epochs": state.epoch, "size": hvd.size()}
        Path(args.out, "result.json").write_text(json.dumps(result))
    print(f"done epochs {state.epoch} size {hvd.size()} rank {hvd.rank()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
