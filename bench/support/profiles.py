"""Where a profiled process spent its time, from cProfile stats or py-spy's collapsed stacks
(`PySpy` records those of a running process).

Both summaries group time by *area*: this project's modules by file (`elastic/driver/job.py`),
other code by its top-level package (`grpc`, `uvicorn`, `asyncio`, ...), and the event loop
waiting for something to do as `idle (epoll wait)` so that it is not mistaken for work.
"""

from __future__ import annotations

import math
import pstats
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

_PACKAGE = re.compile(r"(?:site-packages|dist-packages)/([^/]+)")
_STDLIB = re.compile(r"/lib/python3\.\d+/([^/]+)")
_PYSPY_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::\d+)?\)$")


def area(filename: str, function: str = "") -> str:
    """The area a function belongs to, from its file name (see the module docstring): a full
    path (cProfile) or one relative to its `sys.path` entry (py-spy)."""
    if "select.epoll" in function or function.startswith("<method 'poll' of"):
        return "idle (epoll wait)"
    if function == "<method 'run' of '_contextvars.Context' objects>":
        # The own time of the loop's callbacks: C code run from them, mostly grpc's Cython.
        return "event-loop callbacks (C: grpc Cython, ...)"
    if filename.startswith("elastic/") or "/elastic/" in filename:
        return "elastic/" + filename.rpartition("elastic/")[2]
    if filename.startswith("bench/") or "/bench/" in filename:
        return "bench (the benchmark's own code)"
    if match := _PACKAGE.search(filename):
        return match.group(1).removesuffix(".py")
    if match := _STDLIB.search(filename):
        return match.group(1).removesuffix(".py")
    if filename == "~":  # a builtin called from Python
        return f"builtin {function}"
    if filename.startswith("<frozen importlib"):
        return "importlib"
    if "/" in filename and not filename.startswith(("/", "<")):
        return filename.partition("/")[0]
    return filename.removesuffix(".py") or function


def _share(seconds: float, total: float) -> float:
    return round(100 * seconds / total, 1) if total else 0.0


def summarize_cprofile(path: str | Path, top: int = 25) -> dict[str, Any]:
    """Own time (tottime) per area and the `top` functions by own time, from a cProfile
    stats file; the event loop's waits are counted apart (`idle (epoll wait)`)."""
    stats = pstats.Stats(str(path))
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in entries.values())
    areas: Counter[str] = Counter()
    for (filename, _, function), entry in entries.items():
        areas[area(filename, function)] += entry[2]
    idle = areas.get("idle (epoll wait)", 0.0)
    busy = total - idle
    functions = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)
    return {
        "profiler": "cProfile (the driver's main thread: its event loop)",
        "total_s": round(total, 2),
        "idle_s": round(idle, 2),
        "busy_s": round(busy, 2),
        "areas_pct_of_busy": {
            name: _share(seconds, busy)
            for name, seconds in areas.most_common()
            if name != "idle (epoll wait)" and _share(seconds, busy) >= 0.5
        },
        "top_functions": [
            {
                "function": f"{area(filename, function)}:{line}({function})",
                "own_s": round(entry[2], 3),
                "with_callees_s": round(entry[3], 3),
                "calls": entry[1],
            }
            for (filename, line, function), entry in functions[:top]
            if area(filename, function) != "idle (epoll wait)"
        ],
    }


def summarize_collapsed(path: str | Path, top: int = 25) -> dict[str, Any]:
    """Samples per area of the innermost frame, and the `top` innermost functions, from
    py-spy's raw output (`--format raw`: one "frame;frame;... count" line a stack; idle
    samples are left out unless py-spy ran with `--idle`)."""
    leaves: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [f for f in stack.split(";") if f]
        parsed = [(_PYSPY_FRAME.match(f), f) for f in frames]
        names = [(m.group("func"), m.group("file")) if m else (raw, "") for m, raw in parsed]
        function, filename = names[-1]
        leaves[f"{area(filename, function)}:{function}"] += samples
        areas[area(filename, function)] += samples
        for name in {area(file, func) for func, file in names}:
            inclusive[name] += samples
    return {
        "profiler": "py-spy (all of the driver's Python threads, active samples only)",
        "samples": total,
        "areas_pct_innermost": {
            name: _share(samples, total)
            for name, samples in areas.most_common()
            if _share(samples, total) >= 0.5
        },
        "areas_pct_anywhere_on_stack": {  # without the trunk every stack shares
            name: _share(samples, total)
            for name, samples in inclusive.most_common(30)
            if 1.0 <= _share(samples, total) < 75.0
        },
        "top_innermost": [
            {"function": name, "pct": _share(samples, total)}
            for name, samples in leaves.most_common(top)
        ],
    }


class PySpy:
    """py-spy sampling a process into a raw collapsed-stack file until `stop()` (or for
    `duration` seconds); `native`: with the C frames (grpc's Cython, libc), which pauses the
    process at each sample."""

    native = False  # `--py-spy-native`, for every sampler of the run

    def __init__(self, pid: int, out: str, duration: float | None = None) -> None:
        limit = ["--duration", str(math.ceil(duration))] if duration else []
        how = ["--native"] if self.native else ["--nonblocking"]
        self._process = subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--rate", "100", *how,
             "--format", "raw", "--output", out, *limit],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
