"""Allreduce bandwidth: `hvd.allreduce` against raw `torch.distributed.all_reduce`.

    python -m bench run allreduce_bandwidth                 (np 2, then np 3)
    python -m bench run allreduce_bandwidth --np 2 --markdown

launches, for each `--np N`, `elasticrun -np N` workers running this file with `--worker`; they
measure both sides on the same (default, Gloo) process group that `hvd.init()` creates,
interleaved per size (A B C D A B C D ...) so that machine noise hits every side alike, and rank
0 reports the median time per call, algorithm bandwidth and bus bandwidth (NCCL-tests: busbw =
algbw * 2*(n-1)/n), and each side's bandwidth as a ratio of raw's. Each run's JSON document goes
to bench/results/allreduce_np{N}.json and to stdout, and the published table of all runs to
stderr (with `--markdown`, the table alone to stdout); the workers' output goes to stderr.

Sides: `raw` is `dist.all_reduce(t)` (in place, Sum); `raw_copy` is
`dist.all_reduce(t.clone())`, raw's cost of returning a new tensor; `hvd_sum` and `hvd_avg` are
`hvd.allreduce(x, op=hvd.Sum)` and `hvd.allreduce(x)` (out of place, as a Horovod user calls
them); `hvd_sum_inplace` is `hvd.allreduce_(t, op=hvd.Sum)`, which isolates the wrapper's own
cost from the out-of-place copy; `hvd_sum_unchecked` is `hvd_sum` with the cross-rank argument
check turned off (`hvd.set_collective_checks(False)`), so `hvd_sum` against it is that check's
cost (one small allgather per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
SIDES = ["raw", "raw_copy", "hvd_sum", "hvd_avg", "hvd_sum_inplace", "hvd_sum_unchecked"]
# compared with raw_copy too: they return a new tensor
OUT_OF_PLACE = ["hvd_sum", "hvd_avg", "hvd_sum_unchecked"]


def unchecked(call, *args, **kwargs):
    """`call(*args, **kwargs)` with the cross-rank argument check off."""
    import elastic.torch as hvd

    hvd.set_collective_checks(False)
    try:
        return call(*args, **kwargs)
    finally:
        hvd.set_collective_checks(True)


def human(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


# --- driver ---------------------------------------------------------------------------------


def drive(args: argparse.Namespace, argv: list[str] | None) -> None:
    from bench.support.elasticrun_launch import run_and_save  # workers never import it
    from bench.support.provenance import command_line

    worker_args = ["--reps", str(args.reps), "--target-s", str(args.target_s)]
    if args.max_bytes:
        worker_args += ["--max-bytes", str(args.max_bytes)]
    docs = []
    for np_ in args.np:
        result = f"allreduce_np{np_}.json"
        command = command_line("allreduce_bandwidth", argv)
        docs.append(run_and_save(__file__, result, np_, worker_args, args.timeout, command))
        if not args.markdown:
            print(json.dumps(docs[-1], indent=2), flush=True)
    print(markdown(docs), file=None if args.markdown else sys.stderr)


def markdown(docs: list[dict]) -> str:
    """The published table (README, Benchmarks) of one run per np."""
    first = docs[0]
    lines = [
        f"Gloo on loopback, torch {first['torch']}, {first['cpus']} CPUs, "
        f"{first['threads_per_rank']} thread per rank; medians of interleaved runs, rank 0.",
        "",
        "| np | size | raw time (us) | raw busbw | hvd `allreduce_` Sum / raw | raw clone busbw "
        "| hvd `allreduce` Sum / raw clone | hvd `allreduce` Average / raw clone "
        "| hvd `allreduce` Sum, check off / raw clone | the check's cost (us) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for doc in docs:
        for r in doc["results"]:
            raw, clone, s, a, i, u = (
                r[k]
                for k in ("raw", "raw_copy", "hvd_sum", "hvd_avg", "hvd_sum_inplace",
                          "hvd_sum_unchecked")
            )  # fmt: skip
            lines.append(
                f"| {doc['np']} | {r['size']} | {raw['time_us']:.0f} | {raw['busbw_GBps']:.3f} "
                f"| {i['ratio_vs_raw']:.2f} | {clone['busbw_GBps']:.3f} "
                f"| {s['ratio_vs_raw_copy']:.2f} | {a['ratio_vs_raw_copy']:.2f} "
                f"| {u['ratio_vs_raw_copy']:.2f} | {s['time_us'] - u['time_us']:.0f} |"
            )
    return "\n".join(lines)


# --- worker ---------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import elastic.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    from elastic.worker.context import current  # read-only: which group hvd uses

    same_group = current().group is dist.group.WORLD

    # Correctness first, on the same group: rank r contributes r + 1 everywhere.
    x = torch.full((1000,), float(rank + 1))
    total = n * (n + 1) / 2
    checks = {
        "hvd_sum": bool(torch.all(hvd.allreduce(x, op=hvd.Sum) == total)),
        "hvd_avg": bool(torch.allclose(hvd.allreduce(x), torch.full_like(x, total / n))),
    }
    y = x.clone()
    dist.all_reduce(y)
    checks["raw"] = bool(torch.all(y == total))
    assert all(checks.values()), checks

    def agree_max(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    sizes = [s for s in SIZES if not args.max_bytes or s <= args.max_bytes]
    rows = []
    for nbytes in sizes:
        numel = nbytes // 4
        # Out-of-place inputs hold data; in-place ones hold zeros so repeated sums stay finite.
        src = torch.randn(numel)
        raw_buf = torch.zeros(numel)
        inplace_buf = torch.zeros(numel)
        calls = {
            "raw": lambda raw_buf=raw_buf: dist.all_reduce(raw_buf),
            "raw_copy": lambda src=src: dist.all_reduce(src.clone()),
            "hvd_sum": lambda src=src: hvd.allreduce(src, op=hvd.Sum),
            "hvd_avg": lambda src=src: hvd.allreduce(src),
            "hvd_sum_inplace": lambda buf=inplace_buf: hvd.allreduce_(buf, op=hvd.Sum),
            "hvd_sum_unchecked": lambda src=src: unchecked(hvd.allreduce, src, op=hvd.Sum),
        }
        # Warm-up (connections, allocator), then calibrate the iterations per repetition so
        # that one repetition of one side takes about target_s; all ranks use rank-wide max.
        for side in SIDES:
            for _ in range(2):
                calls[side]()
        t0 = time.perf_counter()
        calls["raw"]()
        calls["hvd_avg"]()
        per_call = agree_max((time.perf_counter() - t0) / 2)
        iters = int(agree_max(min(500, max(3, round(args.target_s / per_call)))))
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.reps):
            for side in SIDES:
                call = calls[side]
                times = samples[side]
                for _ in range(iters):
                    t = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t)
        row: dict = {"bytes": nbytes, "size": human(nbytes), "iters": iters * args.reps}
        raw_time = statistics.median(samples["raw"])
        raw_copy_time = statistics.median(samples["raw_copy"])
        for side in SIDES:
            med = statistics.median(samples[side])
            algbw = nbytes / med / 1e9
            row[side] = {
                "time_us": round(med * 1e6, 1),
                "algbw_GBps": round(algbw, 3),
                "busbw_GBps": round(algbw * 2 * (n - 1) / n, 3),
                "ratio_vs_raw": round(raw_time / med, 3),
            }
            if side in OUT_OF_PLACE:
                row[side]["ratio_vs_raw_copy"] = round(raw_copy_time / med, 3)
        rows.append(row)
        if rank == 0:
            print(
                f"{human(nbytes):>7}: "
                + "  ".join(
                    f"{s} {row[s]['time_us']:.0f}us x{row[s]['ratio_vs_raw']}" for s in SIDES
                ),
                flush=True,
            )

    if rank == 0:
        doc = {
            "benchmark": "allreduce_bandwidth",
            "np": n,
            "backend": dist.get_backend(),
            "same_process_group": same_group,
            "dtype": "float32",
            "torch": torch.__version__,
            "threads_per_rank": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "repetitions": args.reps,
            "statistic": "median of per-call times over all repetitions, rank 0",
            "ratio": "bandwidth of the side / raw's (= raw time / side time); 1.0 is parity",
            "correctness": checks,
            "results": rows,
        }
        Path(args.result_file).write_text(json.dumps(doc))
    hvd.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--np", type=int, nargs="+", default=[2, 3], help="numbers of worker processes, in turn"
    )
    parser.add_argument("--reps", type=int, default=10, help="interleaved repetitions per size")
    parser.add_argument(
        "--target-s", type=float, default=0.25, help="seconds per repetition of one side"
    )
    parser.add_argument("--max-bytes", type=int, default=0, help="skip sizes above this")
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
