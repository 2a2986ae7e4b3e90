"""The fault soak's training job: many short epochs of small steps until the test says stop.

Like `elastic_job.py`, the ranks count with an allreduce how often each sample was trained
on, in a buffer of the model that TorchState commits, restores and syncs; at the end every
count must equal the number of epochs trained. The number of epochs is not fixed: at the
start of every epoch from `--min-epochs` on (never in the middle of one, where the training
function resumes after a reset), the ranks agree (an allreduce of "does `--stop-file`
exist") whether to stop, so the test can keep the job training for as long as
its faults take and then end it cleanly. The epoch count is part of the state, so it rolls
back and forward with the counts.

Prints `worker pid=P` at start, `joined rank=R size=N pid=P` after `hvd.init()`,
`step S epoch E size N rank R pid P t T` per step (T: wall-clock time when the step's
allreduce returned) and `done epochs E size N rank R` at the end. Every step line is also
appended, after it was printed, to `--side-dir/<pid>.log`, written by the worker itself:
the test checks that every line there reached the launcher. Rank 0 writes `result.json`
(counts and epochs) into `--out`.
"""

from __future__ import annotations

import time

import soak_worker  # this script's folder is first on its path
import torch

import elastic.torch as hvd


def main() -> None:
    args = soak_worker.parse_args(commit_every=2)
    side = soak_worker.join(args.side_dir)
    torch.manual_seed(0)
    n, b = args.samples, args.batch
    data = torch.randn(n, 4)
    target = data.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    model.register_buffer("counts", torch.zeros(n))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    sampler = hvd.elastic.ElasticSampler(range(n), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0
    )
    loader = torch.utils.data.DataLoader(range(n), sampler=sampler, batch_size=b)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.max_epochs:
            if soak_worker.stop_requested(state, args):
                return
            for k, idx in enumerate(loader):  # padded shards: the same steps on every rank
                optimizer.zero_grad()
                loss = ((model(data[idx]) - target[idx]) ** 2).sum() / (b * hvd.size())
                loss.backward()
                optimizer.step()
                seen = torch.zeros(n)
                seen[idx[~state.sampler.padding_mask(k, b)]] = 1.0  # repeats are not counted
                hvd.allreduce_(seen, op=hvd.Sum)
                trained_at = time.time()
                with torch.no_grad():
                    model.counts += seen
                state.sampler.record_batch(k, b)
                state.step += 1
                soak_worker.report_step(state, side, trained_at)
                time.sleep(args.step_delay)
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    soak_worker.finish(state, model.counts, args.out)


if __name__ == "__main__":
    main()
