#!/usr/bin/env bash
# Run the benchmarks for np 2 and 3 and print their results as markdown tables.
#
#     bash bench/run_all.sh
#
# JSON results (and the workers' logs) go to bench/results/; the tables go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
PYTHON=${PYTHON:-python}
start=$(date +%s)
for np in 2 3; do
    echo "allreduce_bandwidth --np $np ..." >&2
    "$PYTHON" -m bench.allreduce_bandwidth --np "$np" >/dev/null 2>"bench/results/allreduce_np$np.log"
    echo "optimizer_step --np $np ..." >&2
    "$PYTHON" -m bench.optimizer_step --np "$np" >/dev/null 2>"bench/results/optimizer_np$np.log"
done
echo "all benchmarks: $(($(date +%s) - start)) s" >&2

"$PYTHON" - <<'EOF'
import json
from pathlib import Path

results = Path("bench/results")
first = json.loads((results / "allreduce_np2.json").read_text())
print(
    f"Gloo on loopback, torch {first['torch']}, {first['cpus']} CPUs, "
    f"{first['threads_per_rank']} thread per rank; medians of interleaved runs, rank 0.\n"
)
print("### hvd.allreduce vs torch.distributed.all_reduce (float32, same process group)\n")
print(
    "busbw in GB/s (NCCL-tests convention); a ratio is hvd bandwidth / raw bandwidth. "
    "`allreduce_` works in place like raw `all_reduce(t)`; `allreduce` returns a new tensor, "
    "like raw `all_reduce(t.clone())`.\n"
)
print(
    "| np | size | raw time (us) | raw busbw | hvd `allreduce_` Sum / raw "
    "| raw clone busbw | hvd `allreduce` Sum / raw clone | hvd `allreduce` Average / raw clone "
    "| hvd `allreduce` Sum / raw |"
)
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for np_ in (2, 3):
    doc = json.loads((results / f"allreduce_np{np_}.json").read_text())
    for r in doc["results"]:
        raw, rc, s, a, i = (r[k] for k in ("raw", "raw_copy", "hvd_sum", "hvd_avg", "hvd_sum_inplace"))
        print(
            f"| {np_} | {r['size']} | {raw['time_us']:.0f} | {raw['busbw_GBps']:.3f} "
            f"| {i['ratio_vs_raw']:.2f} | {rc['busbw_GBps']:.3f} | {s['ratio_vs_raw_copy']:.2f} "
            f"| {a['ratio_vs_raw_copy']:.2f} | {s['ratio_vs_raw']:.2f} |"
        )

print("\n### Training step: hvd.DistributedOptimizer vs DistributedDataParallel (SGD)\n")
print("Median step time in ms (forward + backward + step); ratio = hvd / DDP (below 1 is faster).\n")
print(
    "| np | model | params (tensors) | DDP, 25 MiB buckets | hvd, 64 MiB fusion | ratio "
    "| hvd, 25 MiB fusion | ratio | no communication |"
)
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for np_ in (2, 3):
    doc = json.loads((results / f"optimizer_np{np_}.json").read_text())
    for r in doc["results"]:
        d, h, h25, loc = r["ddp"], r["hvd"], r["hvd_25MiB"], r["local"]
        print(
            f"| {np_} | {r['model']} | {r['params'] / 1e6:.2f}M ({r['param_tensors']}) "
            f"| {d['step_ms']:.1f} | {h['step_ms']:.1f} | {h['ratio_vs_ddp']:.2f} "
            f"| {h25['step_ms']:.1f} | {h25['ratio_vs_ddp']:.2f} | {loc['step_ms']:.1f} |"
        )
EOF

# Fault tolerance (about 6 more minutes): the etcd backend against memory with the real driver
# and simulated workers, and a driver SIGKILLed with a worker then restarted.
echo "etcd_backend ..." >&2
"$PYTHON" -m bench.etcd_backend >/dev/null 2>bench/results/etcd_backend.log
echo "driver_restart ..." >&2
"$PYTHON" -m bench.driver_restart >/dev/null 2>bench/results/driver_restart.log
"$PYTHON" - <<'EOF'
import json
from pathlib import Path

for name, title in (
    ("etcd_backend", "Epoch formation and re-form: etcd backend vs memory (seconds, CPU %)"),
    ("driver_restart", "Driver + worker SIGKILL, driver restarted vs worker SIGKILL (seconds)"),
):
    doc = json.loads(Path(f"bench/results/{name}.json").read_text())
    print(f"\n### {title}\n")
    print(doc["table"])
EOF
