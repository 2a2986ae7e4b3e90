"""Where the benchmarks find things: this checkout, the results folder, the workloads."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: bench/, elastic/, tests/
RESULTS = ROOT / "bench" / "results"  # every benchmark's JSON (ignored by git)
WORKLOADS = ROOT / "bench" / "workloads"  # the training scripts the recovery benchmarks run
