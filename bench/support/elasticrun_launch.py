"""Run a benchmark file's own workers under `elasticrun` and save rank 0's JSON.

Such a benchmark is one file that is both the driver (`python -m bench run NAME --np N`) and
the worker (`python bench/NAME.py --worker`, started by `elasticrun`); rank 0 writes its JSON
document to `--result-file`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.support.paths import RESULTS


def elasticrun() -> list[str]:
    exe = shutil.which("elasticrun")
    return [exe] if exe else [sys.executable, "-m", "elastic.driver.cli"]


def launch(
    script: str, np_: int, worker_args: list[str], timeout_s: float
) -> tuple[dict, list[str], float]:
    """Run `script`'s workers under elasticrun; return rank 0's JSON, the command, wall s."""
    with tempfile.TemporaryDirectory(prefix="elasticrun-bench-") as tmp:
        result_file = Path(tmp) / "rank0.json"
        cmd = [
            *elasticrun(),
            "-np",
            str(np_),
            sys.executable,
            str(Path(script).resolve()),
            "--worker",
            "--result-file",
            str(result_file),
            *worker_args,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        start = time.perf_counter()
        # Workers' output goes to stderr: stdout carries only the JSON document.
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, env=env, timeout=timeout_s)
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not result_file.exists():
            raise SystemExit(f"benchmark failed (exit code {proc.returncode}): {' '.join(cmd)}")
        return json.loads(result_file.read_text()), cmd, wall


def run_and_save(
    script: str, name: str, np_: int, worker_args: list[str], timeout_s: float, command: str
) -> dict:
    """Launch, add how to reproduce the run (`command`), save the JSON as results/NAME and
    return it. Raises SystemExit when the run fails."""
    doc, cmd, wall = launch(script, np_, worker_args, timeout_s)
    doc["command"] = command
    doc["launch_command"] = " ".join(cmd)
    doc["wall_s"] = round(wall, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(doc, indent=2) + "\n")
    return doc
