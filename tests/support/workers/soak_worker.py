"""What both soak jobs (`soak_job.py`, `sharded_soak_job.py`) share: their flags, joining the
job with a side log, the stop request between epochs, each step's line and the result.

Each step's line, `step S epoch E size N rank R pid P t T`, goes to stdout and to the worker's
side log in `--side-dir` (the soak reads it after a driver restart, whose output capture is
new). Rank 0 writes `result.json` (the per-sample counts) into `--out` at the end."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import IO, Any

import torch

import elastic.torch as hvd


def parse_args(commit_every: int) -> argparse.Namespace:
    """The soak jobs' flags; `commit_every` is the job's default interval."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--side-dir", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--min-epochs", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--commit-every", type=int, default=commit_every)
    parser.add_argument("--step-delay", type=float, default=0.03)
    return parser.parse_args()


def join(side_dir: str) -> IO[str]:
    """Say this worker's pid, `hvd.init()`, say its rank; its side log, line-buffered."""
    pid = os.getpid()
    print(f"worker pid={pid}", flush=True)
    side = open(Path(side_dir, f"{pid}.log"), "a", buffering=1)  # noqa: SIM115
    hvd.init()
    print(f"joined rank={hvd.rank()} size={hvd.size()} pid={pid}", flush=True)
    return side


def stop_requested(state: Any, args: argparse.Namespace) -> bool:
    """Whether to stop here: only between epochs (a reset re-enters `train` mid-epoch, and
    stopping there would leave that epoch partly trained; every rank sees the same processed
    indices here), from `--min-epochs` on, once any rank sees the stop file. A collective."""
    if state.sampler.processed_indices or state.epoch < args.min_epochs:
        return False
    flag = torch.tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
    hvd.allreduce_(flag, op=hvd.Max)
    return bool(flag.item() > 0)


def report_step(state: Any, side: IO[str], trained_at: float) -> None:
    """The step's line, on stdout and in the side log."""
    line = (
        f"step {state.step} epoch {state.epoch} size {hvd.size()} rank {hvd.rank()} "
        f"pid {os.getpid()} t {trained_at:.3f}"
    )
    print(line, flush=True)
    side.write(line + "\n")


def finish(state: Any, counts: torch.Tensor, out: str) -> None:
    """Rank 0 writes `result.json`; every rank says it is done and shuts down."""
    if hvd.rank() == 0:
        result = {"counts": counts.tolist(), "epochs": state.epoch, "size": hvd.size()}
        Path(out, "result.json").write_text(json.dumps(result))
    print(f"done epochs {state.epoch} size {hvd.size()} rank {hvd.rank()}", flush=True)
    hvd.shutdown()
