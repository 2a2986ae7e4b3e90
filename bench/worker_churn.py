"""Churn: what the driver holds after thousands of replaced workers, with --worker-history
and with every ended record kept (as before it existed).

    python -m bench run worker_churn

The driver's real parts replace a SIGKILLed worker of a 4-worker job over and over in this
process (`tests.support.churning_driver.ChurningDriver`: only the worker processes are
simulated). At each checkpoint it reports the `/v1/status` JSON's size, the fastest of 15
status builds (ms), the saved state's and a scrape's sizes, the memory allocated since the
first replacement (tracemalloc, after a collection) and the mean CPU time of one replacement
since the previous checkpoint (this process's CPU time: the machine may be shared). "kept
32" is the default; "kept all" keeps every ended record (`--worker-history` at its maximum),
as drivers before it did. JSON on stdout and in bench/results/worker_churn.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import platform
import sys
import time
import tracemalloc
from typing import Any

from bench.support.paths import RESULTS
from bench.support.provenance import command_line, git_state
from elastic.driver.settings import DEFAULT_WORKER_HISTORY, MAX_WORKER_HISTORY
from tests.support.churning_driver import ChurningDriver

RESULT_FILE = RESULTS / "worker_churn.json"


def _look(driver: ChurningDriver, since: float, replaced: int) -> dict[str, Any]:
    gc.collect()
    memory = tracemalloc.get_traced_memory()[0]
    builds = []
    for _ in range(15):
        start = time.perf_counter()
        status = driver.status()
        builds.append(time.perf_counter() - start)
    return {
        "replacements": driver.replaced,
        "listed_workers": len(status.workers),
        "status_kib": round(len(status.model_dump_json()) / 1024, 1),
        "status_build_ms": round(min(builds) * 1e3, 3),
        "saved_state_kib": round(len(driver.saved_state()) / 1024, 1),
        "scrape_kib": round(len(driver.scrape()) / 1024, 1),
        "memory_mib": round(memory / 2**20, 2),
        "cpu_ms_per_replacement": round((time.process_time() - since) / replaced * 1e3, 2),
    }


async def churn(kept: int, checkpoints: list[int]) -> list[dict[str, Any]]:
    driver = ChurningDriver(4, history=kept)
    await driver.start()
    rows = []
    tracemalloc.start()
    try:
        for checkpoint in checkpoints:
            since, before = time.process_time(), driver.replaced
            while driver.replaced < checkpoint:
                await driver.replace_one()
            rows.append(_look(driver, since, checkpoint - before))
            print(f"kept {kept}: {rows[-1]}", flush=True, file=sys.stderr)
    finally:
        tracemalloc.stop()
        await driver.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoints",
        default="500,1000,2000,5000",
        help="replacement counts to report at (default 500,1000,2000,5000)",
    )
    parser.add_argument("--kept-all-up-to", type=int, default=1000,
                        help="the last checkpoint run with every record kept (it slows down "
                        "as records pile up; default 1000)")  # fmt: skip
    args = parser.parse_args(argv)
    checkpoints = sorted(int(n) for n in args.checkpoints.split(","))
    logging.getLogger("elasticrun").disabled = True  # an error line per death
    doc = {
        "benchmark": "worker_churn",
        "command": command_line("worker_churn", argv),
        "python": platform.python_version(),
        "git": git_state(),
        "what": "after N replaced workers: /v1/status size and build time, saved state and "
        "scrape sizes, memory allocated, CPU ms per replacement",
        f"kept {DEFAULT_WORKER_HISTORY}": asyncio.run(churn(DEFAULT_WORKER_HISTORY, checkpoints)),
        "kept all": asyncio.run(
            churn(MAX_WORKER_HISTORY, [n for n in checkpoints if n <= args.kept_all_up_to])
        ),
    }
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
