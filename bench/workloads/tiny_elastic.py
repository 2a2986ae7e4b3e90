"""The recovery benchmarks' workload for elasticrun, in Horovod Elastic's style.

    elasticrun -np 2 --min-np 1 --max-np 3 \\
        --host-discovery-script discovery_scripts/hosts_file.sh --discovery-interval 0.2 \\
        python bench/workloads/tiny_elastic.py --out /tmp/somewhere

`hvd.elastic.run` with a `TorchState` (model, optimizer, `ElasticSampler`, epoch, step) that is
committed in memory every `--commit-every` steps; the run loop restores and syncs it after a
failure and syncs it to joining workers. Model, data and printed lines: `bench/workloads`.
Also prints `event reset size N rank R ...` when a re-formed epoch is entered (before the
state sync) and the `elastic` logger's messages with a timestamp (`log t T ...`).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads import event  # noqa: E402

event("process up")  # before the heavy imports: `event started` comes after them

import torch  # noqa: E402

import elastic.torch as hvd  # noqa: E402
from bench.workloads import (  # noqa: E402
    BATCH,
    LR,
    build_model,
    line,
    make_data,
    parse_args,
    start_safety_timer,
)


def main() -> None:
    args = parse_args(__doc__ or "")
    start_safety_timer(args.max_seconds)
    logging.basicConfig(format="log t %(created).6f %(name)s: %(message)s")
    logging.getLogger("elastic").setLevel(logging.INFO)
    event("started")
    torch.set_num_threads(1)
    hvd.init()
    event(f"initialized size {hvd.size()} rank {hvd.rank()}")
    features, targets = make_data(args.samples)
    model = build_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters()
    )
    sampler = hvd.elastic.ElasticSampler(range(args.samples), shuffle=True, seed=0)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0
    )
    state.register_reset_callbacks([lambda: event(f"reset size {hvd.size()} rank {hvd.rank()}")])
    event(f"ready size {hvd.size()} rank {hvd.rank()}")

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        line("enter", state.step, hvd.size(), hvd.rank())
        while True:
            mine = list(state.sampler)
            # Full batches only, the same number on every rank (every rank must join every
            # allreduce); the few samples left over at an epoch's end are skipped.
            steps = len(state.sampler.remaining_indices) // (BATCH * hvd.size())
            for k in range(steps):
                idx = mine[k * BATCH : (k + 1) * BATCH]
                time.sleep(args.compute_s)
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(k, BATCH)
                state.step += 1
                line("step", state.step, hvd.size(), hvd.rank())
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)

    train(state)


if __name__ == "__main__":
    main()
