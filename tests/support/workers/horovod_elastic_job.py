"""A Horovod elastic scenario's worker, as Horovod's own integration tests run it.

Modelled on what Horovod's `test/integration/data/elastic_torch_main.py` does (written anew;
only the import is elasticrun's): a small model trains `--epochs` epochs of
`--batches-per-epoch` batches, committing a `TorchState` every `--batches-per-commit`
batches and at the end of each epoch. At the end of each epoch rank 0 appends one JSON line
to `--logfile` (epoch, batch, commits, hostname, start_rank, rank, size, rendezvous: how
many times `train` was entered). When `--discovery-schedule` says the hosts change after
this epoch, rank 0 waits, as Horovod's script does, for the driver's word by polling
`state._host_messages.empty()` (up to `--discovery-wait` s, else `TimeoutError`).
`--exit-schedule` maps "(epoch, batch)" to the start ranks that fail there, by an exception
(`--exit-mode exception`) or SIGKILL (`--exit-mode kill`).

Prints `epoch E batch B rank R size N` at the start of each epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import elastic.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches-per-epoch", type=int, default=10)
    parser.add_argument("--batches-per-commit", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epoch-wait", type=float, default=0.0, help="seconds per epoch end")
    parser.add_argument("--logfile", required=True, help="rank 0 appends a line per epoch")
    parser.add_argument("--discovery-schedule", default="[]", help="[[epoch|null, hosts], ...]")
    parser.add_argument("--discovery-wait", type=float, default=3.0)
    parser.add_argument("--exit-schedule", default="{}", help='{"(epoch, batch)": [ranks]}')
    parser.add_argument("--exit-mode", choices=["exception", "kill"], default="exception")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    data = torch.randn(32, 2)
    target = torch.randint(0, 2, (32,))
    lr = 0.001
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    hostname = os.environ.get("HOROVOD_HOSTNAME")
    start_rank = int(os.environ.get("HOROVOD_RANK", "0"))
    schedule = json.loads(args.discovery_schedule)
    hosts_at = {epoch: hosts for epoch, hosts in schedule if epoch is not None}
    default_hosts = schedule[-1][1] if schedule else []
    exits = json.loads(args.exit_schedule)

    def fail_if_scheduled(epoch: int, batch: int) -> None:
        if start_rank not in exits.get(str((epoch, batch)), []):
            return
        if args.exit_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"scheduled failure at epoch {epoch} batch {batch}, rank {start_rank}")

    def log_epoch(state: hvd.elastic.TorchState) -> None:
        line = {
            "epoch": state.epoch,
            "batch": state.batch,
            "commits": state.commits,
            "hostname": hostname,
            "start_rank": start_rank,
            "rank": hvd.rank(),
            "size": hvd.size(),
            "rendezvous": state.rendezvous,
        }
        with open(args.logfile, "a") as log:
            log.write(json.dumps(line) + "\n")

    def wait_for_the_driver(state: hvd.elastic.TorchState) -> None:
        """Horovod's way: poll the state's queue of host messages until one arrives."""
        begun = time.monotonic()
        while state._host_messages.empty():
            if time.monotonic() - begun > args.discovery_wait:
                raise TimeoutError("no host update from the driver in time")
            time.sleep(0.1)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        state.rendezvous += 1
        while state.epoch < args.epochs:
            print(f"epoch {state.epoch} batch {state.batch} rank {hvd.rank()} size {hvd.size()}",
                  flush=True)  # fmt: skip
            while state.batch < args.batches_per_epoch:
                fail_if_scheduled(state.epoch, state.batch)
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commits += 1
                    state.commit()
            if hvd.rank() == 0:
                log_epoch(state)
                now = hosts_at.get(state.epoch, default_hosts)
                then = hosts_at.get(state.epoch + 1, default_hosts)
                if args.discovery_wait > 0 and now != then:
                    print(f"host changes: {now} -> {then}", flush=True)
                    wait_for_the_driver(state)
            if args.epoch_wait > 0:
                time.sleep(args.epoch_wait)
            state.epoch += 1
            state.batch = 0
            state.commits += 1
            state.commit()

    def rescale_lr() -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
    state.register_reset_callbacks([rescale_lr])
    train(state)


if __name__ == "__main__":
    main()
