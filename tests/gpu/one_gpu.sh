#!/usr/bin/env bash
# Every GPU check this project has, as far as one GPU allows, in one run (docs/testing.md, GPU
# tests): a probe of which collectives Gloo runs on CUDA tensors (probe_gloo_cuda.py); the tests
# under tests/gpu (one NCCL rank; several Gloo ranks with CUDA tensors; the two-GPU test
# skips); then, unless ONE_GPU_BENCH=0, the GPU variants of the benchmarks durable_commit_cost
# and sharded_commit_cost. Run from the repository root:
#
#     bash tests/gpu/one_gpu.sh [OUT_DIR]
#
# OUT_DIR (default: $OUT, else bench/results/gpu) receives machine.txt, each step's log and the
# benchmarks' JSON. Where this project's dependencies are missing and a folder .whl of wheels
# travels with the checkout, they are installed from it into /tmp/site first (no network).
# Exits 1 when a test or a benchmark failed.
set -uo pipefail
out="${1:-${OUT:-bench/results/gpu}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crashing rank prints its stack
if [ -d .whl ] && ! python3 -c "import fastapi, uvicorn, grpc, tenacity" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, \
torch.cuda.nccl.version())), 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$out/machine.txt"
status=0
timeout 300 python3 tests/gpu/probe_gloo_cuda.py "$out/gloo_cuda.json" 2>&1 | tee "$out/gloo_cuda.log"
timeout 240 python3 -m pytest tests/gpu -v -rs -p no:cacheprovider --timeout 150 2>&1 \
    | tee "$out/gpu_tests.log" || status=1
[ "${ONE_GPU_BENCH:-1}" = 0 ] && exit $status  # ONE_GPU_BENCH=0: the checks alone
timeout 200 python3 -m bench run durable_commit_cost --device cuda --batch 8192 --steps 100 \
    --trials 2 --out "$out/durable_commit_cuda.json" 2>&1 | tee "$out/durable_commit.log" \
    || status=1
timeout 200 python3 -m bench run sharded_commit_cost --out "$out/sharded_commit_cuda.json" 2>&1 \
    | tee "$out/sharded_commit.log" || status=1
exit $status
