"""The sharded recovery benchmark's workload for torchrun: the same FSDP2 language model, as a
typical torchrun job keeps it, with a DCP checkpoint on local disk every few steps.

    torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job --max-restarts=100 \\
        bench/workloads/sharded_torchrun.py --out /tmp/somewhere --commit-every 10

torchrun restarts every worker on any failure or membership change, so the job keeps no state
in memory across one: every `--commit-every` steps (after the first `--quiet-steps`, which
take none) the ranks save the model and Adam's state with `torch.distributed.checkpoint` to
`OUT/dcp/step_N` (synchronously, each rank its own shards), then rank 0 points `OUT/latest`
at it; every (re)started worker builds the model for its world size and, where `latest`
exists, loads that checkpoint (DCP re-shards it for any world size). The two newest
checkpoints are kept. Prints the lines of `bench/workloads` and `metric NAME VALUE rank R pid
P t T` lines: `checkpoint_s` (a save, as long as it blocks the step) and `load_s` (a resumed
worker's load of the checkpoint).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads import event  # noqa: E402

event("process up")  # before the heavy imports: `event started` comes after them

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from bench.workloads import arg_parser, line, start_safety_timer  # noqa: E402
from bench.workloads.transformer import add_model_args, build, train_step  # noqa: E402

KEEP = 2  # checkpoints kept on disk


def metric(name: str, value: float) -> None:
    rank = dist.get_rank()
    print(
        f"metric {name} {value:.4f} rank {rank} pid {os.getpid()} t {time.time():.6f}", flush=True
    )


def load(model, optimizer, folder: Path) -> None:
    """Load the checkpoint in `folder` into the freshly built model and optimizer."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def save(model, optimizer, out: Path, step: int) -> None:
    """Save a checkpoint of `step` (a collective); rank 0 then marks it the latest and drops
    the old ones."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    folder = out / "dcp" / f"step_{step}"
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    if dist.get_rank() == 0:
        pointer = out / "latest.tmp"
        pointer.write_text(str(step))
        os.replace(pointer, out / "latest")
        done = sorted((out / "dcp").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        for old in done[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    parser = arg_parser(__doc__ or "")
    add_model_args(parser)
    parser.add_argument("--quiet-steps", type=int, default=0, help="steps without checkpoints")
    args = parser.parse_args()
    start_safety_timer(args.max_seconds)
    event("started")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("GROUP_RANK", "?")
    event(f"initialized size {size} rank {rank} node {node}")
    model, optimizer = build(args, init_device_mesh("cpu", (size,)))
    event(f"ready size {size} rank {rank} node {node}")
    out = Path(args.out)
    step = 0
    if (latest := out / "latest").exists():
        step = int(latest.read_text())
        start = time.perf_counter()
        load(model, optimizer, out / "dcp" / f"step_{step}")
        metric("load_s", time.perf_counter() - start)
    line("enter", step, size, rank)
    while True:
        train_step(model, optimizer, args, step, rank)
        step += 1
        line("step", step, size, rank)
        if step > args.quiet_steps and step % args.commit_every == 0:
            start = time.perf_counter()
            save(model, optimizer, out, step)
            metric("checkpoint_s", time.perf_counter() - start)


if __name__ == "__main__":
    main()
