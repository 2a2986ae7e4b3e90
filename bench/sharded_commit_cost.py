"""What `ShardedState` commits cost training on one GPU: the sharded recovery benchmark's
language model (`bench/workloads/transformer.py`), sharded by FSDP2 over a one-rank mesh,
trained with and without an in-memory commit every `--commit-every` steps.

    python -m bench run sharded_commit_cost                        (a GPU: ~350M parameters)
    python -m bench run sharded_commit_cost --device cpu --dim 256 --layers 4 --vocab 4096 \
        --seq 32 --batch 2                                          (a quick run on the CPU)

One process, one rank (`cpu:gloo,cuda:nccl` on a GPU, as the worker runtime forms it), no
driver and no replica (`replicas=0`: a commit is the snapshot of this rank's shards to host
memory, which is what one GPU can show; replication to another host is measured by
`sharded_recovery`). Each trial runs both modes back to back, in a rotating order. Reported:
steps per second of each mode over the steps after `--warmup`, the commits' cost against no
commits (the target: 5 %), each commit's blocking time (`state.commit()`, the device
synchronised first), and the host memory the commits hold. Two commits before the trials,
timed apart (`setup_commit_s`), allocate the pinned host buffers that the commits of GPU
tensors then reuse (the newest commit's and a spare: `held_bytes`, twice the state).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.support.provenance import (
    command_line,
    device_name,
    git_state,
    load_averages,
    write_document,
)
from bench.workloads.transformer import add_model_args, build, parameter_count, train_step
from elastic.protocol.http import SlotInfo
from elastic.state.sharded import ShardedState
from elastic.worker import context
from elastic.worker.group.process_group import backend_for

MODES = ("no commits", "in-memory commits")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_model_args(parser)
    parser.set_defaults(dim=1024, layers=24, vocab=32000, seq=1024, batch=8)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per mode (default 40)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sharded_commit_cost.json"))
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def one_rank_group(device: torch.device) -> None:
    """A group of one rank with the worker runtime's backends, and a worker context over it
    (no driver)."""
    dist.init_process_group(
        backend_for(device), store=dist.HashStore(), rank=0, world_size=1,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    slot = SlotInfo(
        hostname="localhost", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1
    )
    context.activate(
        context.WorkerContext(slot=slot, round=1, group=dist.group.WORLD, device=device)
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_mode(mode: str, args: argparse.Namespace, state: ShardedState) -> dict[str, Any]:
    device = torch.device(args.device)
    commit_s: list[float] = []
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            synchronize(device)
            started = time.perf_counter()
        train_step(state.model, state.optimizer, args, step, 0)
        if mode == MODES[1] and (step + 1) % args.commit_every == 0:
            synchronize(device)
            began = time.perf_counter()
            state.commit()
            commit_s.append(time.perf_counter() - began)
    synchronize(device)
    seconds = time.perf_counter() - started
    record: dict[str, Any] = {"mode": mode, "steps_per_s": round(args.steps / seconds, 3)}
    if commit_s:
        record.update(
            commits=len(commit_s),
            commit_s_median=round(statistics.median(commit_s), 4),
            commit_s_max=round(max(commit_s), 4),
            held_bytes=state._slots.nbytes(),
        )
    return record


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    one_rank_group(device)
    state = ShardedState(partial(build, args), replicas=0)
    state.sync_if_needed(True)
    parameters = parameter_count(args.dim, args.layers, args.vocab)
    print(f"sharded_commit: {parameters / 1e6:.0f}M parameters on {args.device}", flush=True)
    train_step(state.model, state.optimizer, args, 0, 0)  # Adam's moments exist from here
    setup_commit_s = []
    for _ in range(2):  # the pinned buffers a commit and the spare use, allocated once
        synchronize(device)
        began = time.perf_counter()
        state.commit()
        setup_commit_s.append(round(time.perf_counter() - began, 4))
    trials: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for trial in range(args.trials):
        for mode in MODES[trial % 2 :] + MODES[: trial % 2]:
            record = run_mode(mode, args, state)
            record["trial"] = trial
            trials.append(record)
            print(json.dumps(record), flush=True)
    median = {
        mode: statistics.median(r["steps_per_s"] for r in trials if r["mode"] == mode)
        for mode in MODES
    }
    blocking = [r["commit_s_median"] for r in trials if "commit_s_median" in r]
    summary = {
        "steps_per_s_median": median,
        "commit_cost_pct": round(100 * (1 - median[MODES[1]] / median[MODES[0]]), 2),
        "commit_blocking_s_median": statistics.median(blocking),
        "step_s_no_commits": round(1 / median[MODES[0]], 4),
        "setup_commit_s": setup_commit_s,
        "held_bytes": state._slots.nbytes(),  # the one commit held: the whole state
        "target": "in-memory commits every 10 steps cost at most 5 % of the training",
    }
    result = {
        "benchmark": "sharded_commit_cost",
        "command": command_line("sharded_commit_cost", argv),
        "git": git_state(),
        "torch": torch.__version__,
        "device": device_name(args.device),
        "parameters": parameters,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "trials": trials,
        "summary": summary,
        "loadavg_1_5_15min": load_averages(load_before),
    }
    write_document(args.out, result, summary)
    context.activate(None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
