"""Training-step time: `hvd.DistributedOptimizer` against `DistributedDataParallel`.

    python -m bench run training_step                 (np 2, then np 3)
    python -m bench run training_step --np 2 --markdown

launches, for each `--np N`, `elasticrun -np N` workers running this file with `--worker`. In
the same worker processes, on the same (default, Gloo) process group, each side trains its own
copy of the same model on the same fixed synthetic batch (per rank) with plain SGD; a step is
zero_grad, forward, backward and optimizer step. The sides run interleaved in rounds (round r: k
steps of each side in turn) so that machine noise hits them alike; rank 0 reports the median
per-step time of each side and its ratio to DDP's. One thread per rank for every side.

Sides: `ddp` (DistributedDataParallel, default 25 MiB buckets), `hvd` (DistributedOptimizer with
its default fusion threshold, 64 MiB), `hvd_25MiB` (fusion_threshold_bytes=25 MiB, DDP's bucket
size), `hvd_unchecked` (`hvd` with the cross-rank check off, so without the one small
exchange per step that lets `hvd.join()` ranks follow), `hvd_in_state` (`hvd` held in a
`hvd.elastic.TorchState`, which counts each step for `--rollback step`: the cost of not rolling
back, against `hvd`) and `local` (the model and optimizer without any communication: the
compute floor).
Models: `mlp` (10 Linear 1024x1024 + ReLU, ~10.5M parameters) and `many_small` (120 blocks of
Linear(32, 32) + LayerNorm(32) + ReLU: 240 layers, 480 parameter tensors, ~134k parameters).
Each run's JSON document goes to bench/results/optimizer_np{N}.json and to stdout, and the
published table of all runs to stderr (with `--markdown`, the table alone to stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SIDES = ["ddp", "hvd", "hvd_25MiB", "hvd_unchecked", "hvd_in_state", "local"]
MODELS = {
    # name: (batch size, input width, steps per side per round)
    "mlp": (32, 1024, 8),
    "many_small": (32, 32, 20),
}


# --- driver ---------------------------------------------------------------------------------


def drive(args: argparse.Namespace, argv: list[str] | None) -> None:
    from bench.support.elasticrun_launch import run_and_save  # workers never import it
    from bench.support.provenance import command_line

    worker_args = ["--rounds", str(args.rounds), "--models", args.models]
    docs = []
    for np_ in args.np:
        result = f"optimizer_np{np_}.json"
        command = command_line("training_step", argv)
        docs.append(run_and_save(__file__, result, np_, worker_args, args.timeout, command))
        if not args.markdown:
            print(json.dumps(docs[-1], indent=2), flush=True)
    print(markdown(docs), file=None if args.markdown else sys.stderr)


def markdown(docs: list[dict]) -> str:
    """The published table (README, Benchmarks) of one run per np."""
    lines = [
        "| np | model | params (tensors) | DDP, 25 MiB buckets | hvd, 64 MiB fusion | ratio "
        "| hvd, 25 MiB fusion | ratio | hvd, check off | ratio | hvd in a TorchState "
        "| vs hvd | no communication |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for doc in docs:
        for r in doc["results"]:
            d, h, h25, off, kept, loc = (
                r[k] for k in ("ddp", "hvd", "hvd_25MiB", "hvd_unchecked", "hvd_in_state", "local")
            )
            lines.append(
                f"| {doc['np']} | {r['model']} | {r['params'] / 1e6:.2f}M ({r['param_tensors']}) "
                f"| {d['step_ms']:.1f} | {h['step_ms']:.1f} | {h['ratio_vs_ddp']:.2f} "
                f"| {h25['step_ms']:.1f} | {h25['ratio_vs_ddp']:.2f} "
                f"| {off['step_ms']:.1f} | {off['ratio_vs_ddp']:.2f} "
                f"| {kept['step_ms']:.1f} | {kept['step_ms'] / h['step_ms']:.3f} "
                f"| {loc['step_ms']:.1f} |"
            )
    return "\n".join(lines)


# --- worker ---------------------------------------------------------------------------------


def build_model(name: str):
    from torch import nn

    if name == "mlp":
        layers = []
        for _ in range(10):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers)
    if name == "many_small":
        layers = []
        for _ in range(120):
            layers += [nn.Linear(32, 32), nn.LayerNorm(32), nn.ReLU()]
        return nn.Sequential(*layers)
    raise ValueError(f"unknown model {name!r}")


def worker(args: argparse.Namespace) -> None:
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import elastic.torch as hvd

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    lr = 1e-3
    results = []
    for model_name in args.models.split(","):
        batch, width, steps = MODELS[model_name]
        torch.manual_seed(0)  # the same initial model on every rank
        base = build_model(model_name)
        hvd.broadcast_parameters(base.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(1000 + rank)  # a different batch per rank
        x = torch.randn(batch, width, generator=gen)
        y = torch.randn(batch, width, generator=gen)

        models = {side: copy.deepcopy(base) for side in SIDES}
        runners = {}
        states = []  # kept alive for the run
        for side, model in models.items():
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            if side == "ddp":
                model = DistributedDataParallel(model)  # default group, bucket_cap_mb=25
            elif side in ("hvd", "hvd_unchecked", "hvd_in_state"):
                opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
                if side == "hvd_in_state":  # counts its steps (--rollback step)
                    states.append(hvd.elastic.TorchState(model=model, optimizer=opt))
            elif side == "hvd_25MiB":
                opt = hvd.DistributedOptimizer(
                    opt,
                    named_parameters=model.named_parameters(),
                    fusion_threshold_bytes=25 * 1024 * 1024,
                )

            def step(model=model, opt=opt, x=x, y=y, checks=side != "hvd_unchecked") -> None:
                hvd.set_collective_checks(checks)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()

            runners[side] = step

        for step in runners.values():  # warm-up: lazy imports, buckets, connections
            for _ in range(3):
                step()
        dist.barrier()
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                step, times = runners[side], samples[side]
                for _ in range(steps):
                    t = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t)
        # Every side took the same number of steps from the same start: the distributed ones
        # must agree (up to summation order), the local one trains on this rank's batch only.
        with torch.no_grad():
            ref = [p.detach() for p in models["ddp"].parameters()]
            max_diff = {
                side: max(
                    float((p - r).abs().max())
                    for p, r in zip(models[side].parameters(), ref, strict=True)
                )
                for side in ("hvd", "hvd_25MiB", "hvd_unchecked", "hvd_in_state")
            }
        ddp_time = statistics.median(samples["ddp"])
        row: dict = {
            "model": model_name,
            "params": sum(p.numel() for p in base.parameters()),
            "param_tensors": sum(1 for _ in base.parameters()),
            "batch": [batch, width],
            "steps_per_side": steps * args.rounds,
            "max_abs_param_diff_vs_ddp": max_diff,
        }
        for side in SIDES:
            med = statistics.median(samples[side])
            row[side] = {
                "step_ms": round(med * 1e3, 2),
                "ratio_vs_ddp": round(med / ddp_time, 3),
            }
        results.append(row)
        if rank == 0:
            print(
                f"{model_name}: "
                + "  ".join(f"{s} {row[s]['step_ms']}ms x{row[s]['ratio_vs_ddp']}" for s in SIDES)
                + f"  diff {max_diff}",
                flush=True,
            )
        del models, runners, states

    if rank == 0:
        doc = {
            "benchmark": "optimizer_step",
            "np": n,
            "backend": dist.get_backend(),
            "torch": torch.__version__,
            "threads_per_rank": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "optimizer": f"SGD(lr={lr})",
            "rounds": args.rounds,
            "statistic": "median per-step time over all rounds, rank 0",
            "ratio": "step time of the side / DDP's; 1.0 is parity, above is slower",
            "results": results,
        }
        Path(args.result_file).write_text(json.dumps(doc))
    hvd.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--np", type=int, nargs="+", default=[2, 3], help="numbers of worker processes, in turn"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument("--timeout", type=float, default=900, help="kill a run after this")
    parser.add_argument(
        "--markdown", action="store_true", help="print the published table, not the JSON"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        drive(args, argv)


if __name__ == "__main__":
    main()
