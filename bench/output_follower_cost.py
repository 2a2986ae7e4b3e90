"""What following detached workers' output files costs the driver's event loop.

    python -m bench run output_follower_cost --files 2000

One `OutputFollower` follows `--files` files in a temporary folder (two a worker folder, as
the driver does), woken by inotify and, separately, by the polling fallback. For each mode it
measures:

* `idle_cpu_ms`: this process' CPU time over 2 s while every file stays quiet;
* `line_latency_ms`: median and worst time from appending a line to one file to the sink
  having it (20 lines, one file at a time, 50 ms apart);
* `busy_loop_late_ms`: the worst lateness of a 10 ms timer while every file receives a line
  every 100 ms for 2 s (writes from a thread); `busy_lines_shown` should equal
  `busy_lines_written`.

The JSON document goes to stdout and bench/results/output_follower.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.support.paths import RESULTS
from bench.support.provenance import command_line
from elastic.driver.launch.follower import OutputFollower


class Counting:
    """A sink that counts lines and stamps the latest."""

    def __init__(self) -> None:
        self.lines = 0
        self.last_at = 0.0

    def write_line(self, line: bytes) -> None:
        self.lines += 1
        self.last_at = time.monotonic()

    def close(self) -> None:
        pass


async def measure(mode: str, count: int, root: Path) -> dict[str, Any]:
    folder = root / mode
    paths = []
    for n in range(count // 2):
        (folder / f"worker.{n}").mkdir(parents=True)
        for stream in ("stdout", "stderr"):
            paths.append(folder / f"worker.{n}" / stream)
            paths[-1].write_bytes(b"")
    follower = OutputFollower(inotify=mode == "inotify")
    sinks = [Counting() for _ in paths]
    for path, sink in zip(paths, sinks, strict=True):
        follower.add(str(path), sink, 0, ended=lambda: False, at=lambda _offset: None)
    await asyncio.sleep(1.0)

    start = time.process_time()
    await asyncio.sleep(2.0)
    idle_cpu = time.process_time() - start

    latencies = []
    for n in range(20):
        sink = sinks[n * 37 % len(sinks)]
        seen = sink.lines
        with open(paths[n * 37 % len(paths)], "ab") as file:
            file.write(b"line\n")
        written = time.monotonic()
        while sink.lines == seen:
            await asyncio.sleep(0.001)
        latencies.append(sink.last_at - written)
        await asyncio.sleep(0.05)

    stop = threading.Event()
    written = [0]

    def write_all() -> None:
        handles = [open(path, "ab", buffering=0) for path in paths]  # noqa: SIM115
        try:
            while not stop.wait(0.1):
                for handle in handles:
                    handle.write(b"busy\n")
                written[0] += len(handles)
        finally:
            for handle in handles:
                handle.close()

    before = sum(sink.lines for sink in sinks)
    writer = threading.Thread(target=write_all)
    writer.start()
    late = 0.0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        tick = time.monotonic()
        await asyncio.sleep(0.01)
        late = max(late, time.monotonic() - tick - 0.01)
    stop.set()
    await asyncio.to_thread(writer.join)
    await asyncio.sleep(1.0)
    await follower.close()
    return {
        "idle_cpu_ms": round(idle_cpu * 1000, 1),
        "line_latency_ms": {
            "median": round(statistics.median(latencies) * 1000, 2),
            "max": round(max(latencies) * 1000, 2),
        },
        "busy_loop_late_ms": round(late * 1000, 1),
        "busy_lines_written": written[0],
        "busy_lines_shown": sum(sink.lines for sink in sinks) - before,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        results = {
            mode: asyncio.run(measure(mode, args.files, Path(root)))
            for mode in ("inotify", "polling")
        }
    document = {
        "benchmark": "output_follower",
        "command": command_line("output_follower_cost", argv),
        "files": args.files,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **results,
    }
    text = json.dumps(document, indent=2)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "output_follower.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
