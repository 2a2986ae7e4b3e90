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
loss beyond the replicas with no checkpoint yet would end it (`ShardsLostError`).

Each step ends with `state.check_host_updates()` (or a commit), so a leaver leaves at a step
boundary. Its lines, side log and result: `soak_worker.py`.
"""

from __future__ import annotations

import time
from typing import Any

import soak_worker  # this script's folder is first on its path
import torch
from tiny_lm import VOCAB, build, train_step

import elastic.torch as hvd

SEQ = 6


def main() -> None:
    args = soak_worker.parse_args(commit_every=3)
    torch.set_num_threads(1)
    side = soak_worker.join(args.side_dir)
    n, b = args.samples, args.batch
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))
    sampler = hvd.elastic.ElasticSampler(range(n), shuffle=True, seed=1)
    state = hvd.elastic.ShardedState(
        build, replicas=1, sampler=sampler, counts=torch.zeros(n), epoch=0, step=0
    )
    assert state.durable_checkpoints is not None, "run with --checkpoint-dir"
    loader = torch.utils.data.DataLoader(range(n), sampler=sampler, batch_size=b)

    def commit(state: Any) -> None:
        state.durable_checkpoints.wait(10)  # so that this commit is checkpointed too
        state.commit()

    @hvd.elastic.run
    def train(state: Any) -> None:
        if state.step == 0:  # the same on every rank: a checkpoint before the first step
            commit(state)
        while state.epoch < args.max_epochs:
            if soak_worker.stop_requested(state, args):
                return
            for k, idx in enumerate(loader):  # padded shards: the same steps on every rank
                train_step(state, tokens, idx, k, b)
                soak_worker.report_step(state, side, time.time())
                time.sleep(args.step_delay)
                if state.step % args.commit_every == 0:
                    commit(state)
                else:
                    state.check_host_updates()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            commit(state)

    train(state)
    soak_worker.finish(state, state.counts, args.out)


if __name__ == "__main__":
    main()
