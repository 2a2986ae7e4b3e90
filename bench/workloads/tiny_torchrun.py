"""The recovery benchmarks' workload for torchrun, as a typical torchrun job writes it.

    torchrun --nnodes=1:3 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job --max-restarts=100 \\
        bench/workloads/tiny_torchrun.py --out /tmp/somewhere

torchrun restarts every worker on any membership change, so the job keeps no state in memory
across one: rank 0 checkpoints model, optimizer and position to `OUT/checkpoint.pt` every
`--commit-every` steps (written to a temporary file, then renamed), and every (re)started
worker resumes from it. `DistributedDataParallel` on Gloo, a `DistributedSampler` per epoch.
Model, data and printed lines: `bench/workloads`.

`--pg-timeout S` passes `timeout=S` to `init_process_group` (default: torch's, 30 minutes for
Gloo): how long a collective may wait for a peer. A peer whose host vanished never answers
nor closes its connections, so without it the survivors wait out torch's default before they
fail and their agents can restart them (bench/host_faults.py).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

if not __package__:  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads import event  # noqa: E402

event("process up")  # before the heavy imports: `event started` comes after them

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from bench.workloads import (  # noqa: E402
    BATCH,
    LR,
    arg_parser,
    build_model,
    line,
    make_data,
    start_safety_timer,
)


def main() -> None:
    parser = arg_parser(__doc__ or "")
    parser.add_argument("--pg-timeout", type=float, default=None, help="seconds (see above)")
    args = parser.parse_args()
    start_safety_timer(args.max_seconds)
    event("started")
    torch.set_num_threads(1)
    if args.pg_timeout is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    event(f"initialized size {size} rank {rank}")
    features, targets = make_data(args.samples)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    event(f"ready size {size} rank {rank}")
    checkpoint = Path(args.out, "checkpoint.pt")
    step, epoch, batch_in_epoch = 0, 0, 0
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step, epoch, batch_in_epoch = saved["step"], saved["epoch"], saved["batch_in_epoch"]
    ddp = DistributedDataParallel(model)
    line("enter", step, size, rank)
    sampler = DistributedSampler(
        range(args.samples), num_replicas=size, rank=rank, shuffle=True, seed=0, drop_last=True
    )
    while True:
        sampler.set_epoch(epoch)
        mine = list(sampler)
        steps = len(mine) // BATCH
        for k in range(batch_in_epoch, steps):  # a resumed epoch skips the batches done
            idx = mine[k * BATCH : (k + 1) * BATCH]
            time.sleep(args.compute_s)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(features[idx]), targets[idx])
            loss.backward()
            optimizer.step()
            step += 1
            line("step", step, size, rank)
            if step % args.commit_every == 0 and rank == 0:
                partial = checkpoint.with_suffix(".tmp")
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "step": step,
                        "epoch": epoch,
                        "batch_in_epoch": k + 1,
                    },
                    partial,
                )
                os.replace(partial, checkpoint)
        epoch, batch_in_epoch = epoch + 1, 0


if __name__ == "__main__":
    main()
