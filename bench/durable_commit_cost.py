"""What durable commits cost training: a ~100M-parameter model with Adam, committed in memory
every `--commit-every` steps, with and without a durable commit (`checkpoint_dir`) at each.

    python -m bench run durable_commit_cost --trials 3 --out bench/results/durable_commit.json

One process, one rank (a Gloo group of 1), on the GPU when there is one (`--device`). Each
trial runs the three modes back to back, in a rotating order: no commits at all; in-memory
commits (`TorchState.commit()`, the snapshot to host memory); and in-memory commits that are
also written to `--dir` in the background. Reported: steps per second of each mode (over
the steps after `--warmup`), the durable mode's cost against the in-memory mode (the target:
at most 2 %), the in-memory commit's cost against no commits, and the writes: how many
started, how long each took, the checkpoint's size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.support.provenance import (
    command_line,
    device_name,
    git_state,
    load_averages,
    write_document,
)
from elastic.protocol.http import SlotInfo
from elastic.state import TorchState
from elastic.worker import context

MODES = ("no commits", "in-memory commits", "durable commits")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per mode (default 60)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--width", type=int, default=4096, help="the MLP's width (default 4096)")
    parser.add_argument("--layers", type=int, default=6, help="its layers (default 6: ~100M)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--dir", help="checkpoint directory (default: a new temporary one)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/durable_commit.json"))
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def one_rank_group() -> None:
    """A Gloo group of one rank, and a worker context over it (no driver: the commit's
    collective check for membership changes runs, with nobody else)."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(60))
    slot = SlotInfo(
        hostname="localhost", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1
    )
    device = torch.device("cpu")
    context.activate(
        context.WorkerContext(slot=slot, round=1, group=dist.group.WORLD, device=device)
    )


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers).to(args.device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def run_mode(
    mode: str, args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="durable-", dir=args.dir) if mode == MODES[2] else None
    state = TorchState(model=model, optimizer=optimizer, checkpoint_dir=directory)
    x = torch.randn(args.batch, args.width, device=args.device)
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            synchronize(args.device)
            started = time.perf_counter()
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        if mode != MODES[0] and (step + 1) % args.commit_every == 0:
            synchronize(args.device)
            state.commit()
    synchronize(args.device)
    seconds = time.perf_counter() - started
    record: dict[str, Any] = {"mode": mode, "steps_per_s": round(args.steps / seconds, 3)}
    if state.durable is not None:
        waited = time.perf_counter()
        state.durable.wait(600)
        record.update(
            commits=state.commit_count,
            writes_started=state.durable.started,
            newest_written=state.durable.written,
            wait_for_last_write_s=round(time.perf_counter() - waited, 3),
            checkpoint_bytes=sum(
                os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
            ),
            kept=state.durable.directory.commits(),
            stale=state.durable.stale,
        )
    return record


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    one_rank_group()
    model, optimizer = build(args)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"durable_commit: {parameters / 1e6:.1f}M parameters on {args.device}", flush=True)
    trials: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for trial in range(args.trials):
        order = MODES[trial % 3 :] + MODES[: trial % 3]  # each mode first once in three
        for mode in order:
            record = run_mode(mode, args, model, optimizer)
            record["trial"] = trial
            trials.append(record)
            print(json.dumps(record), flush=True)
    rates = {mode: [r["steps_per_s"] for r in trials if r["mode"] == mode] for mode in MODES}
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    summary = {
        "steps_per_s_median": median,
        "durable_cost_vs_in_memory_pct": round(100 * (1 - median[MODES[2]] / median[MODES[1]]), 2),
        "in_memory_cost_vs_none_pct": round(100 * (1 - median[MODES[1]] / median[MODES[0]]), 2),
        "target": "durable commits every 10 steps cost at most 2 % against in-memory ones",
    }
    result = {
        "benchmark": "durable_commit",
        "command": command_line("durable_commit_cost", argv),
        "git": git_state(),
        "torch": torch.__version__,
        "device": device_name(args.device),
        "cpus": os.cpu_count(),
        "parameters": parameters,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "trials": trials,
        "summary": summary,
        "loadavg_1_5_15min": load_averages(load_before),
    }
    write_document(args.out, result, summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
