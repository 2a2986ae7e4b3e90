"""Watching a driver from outside, as an operator would: its resident memory and open
descriptors sampled from /proc, and how long `/v1/status` with the token takes to answer.
Used by `bench/abuse.py` and `tests/e2e/elastic/test_abuse.py`; each watcher runs in a thread of
its own until `stop`, and `window(start, end)` summarises the samples taken in [start, end) (times
are `time.time()`).
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def resident_mib(pid: int) -> float | None:
    """VmRSS of process `pid` in MiB; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def open_descriptors(pid: int) -> int | None:
    """How many file descriptors process `pid` has open; None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def open_file_limit(pid: int) -> int | None:
    """The soft limit on open files of process `pid` now (None: gone or unlimited)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return None if soft == "unlimited" else int(soft)
    except OSError:
        return None
    return None


class DriverWatch:
    """Samples the resident memory and descriptor count of process `pid` every `every` s.

    With `rss_cap_mib`, the first sample above it calls `on_cap(rss_mib)` once (from the
    sampling thread): a safety stop for a driver that grows without bound, so that a hostile
    client cannot take a shared machine's memory."""

    def __init__(
        self,
        pid: int,
        every: float = 0.15,
        rss_cap_mib: float | None = None,
        on_cap: Callable[[float], None] | None = None,
    ) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float, int]] = []  # (time, rss MiB, descriptors)
        self.capped_at: float | None = None  # time.time() when the cap was hit
        self._every = every
        self._cap = rss_cap_mib
        self._on_cap = on_cap
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            rss, fds = resident_mib(self.pid), open_descriptors(self.pid)
            if rss is None or fds is None:
                return  # the driver is gone
            self.samples.append((time.time(), rss, fds))
            if self._cap is not None and rss > self._cap and self.capped_at is None:
                self.capped_at = time.time()
                if self._on_cap is not None:
                    self._on_cap(rss)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(5)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Peak and mean resident MiB, peak descriptors, over the samples in [start, end)."""
        taken = [(rss, fds) for t, rss, fds in self.samples if start <= t < end]
        if not taken:
            return {"samples": 0}
        return {
            "samples": len(taken),
            "peak_rss_mib": round(max(r for r, _ in taken), 1),
            "mean_rss_mib": round(sum(r for r, _ in taken) / len(taken), 1),
            "peak_fds": max(f for _, f in taken),
        }


def status_latency(host: str, port: int, token: str, timeout: float = 10.0) -> float | None:
    """Seconds `GET /v1/status` with the token took on a fresh connection; None when it failed
    or answered other than 200."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/v1/status", headers={"Authorization": f"Bearer {token}"})
        answer = conn.getresponse()
        answer.read()
        ok = answer.status == 200
    except OSError:
        ok = False
    finally:
        conn.close()
    return time.perf_counter() - start if ok else None


class StatusPoller:
    """Polls `status_latency` every `every` s in a thread until `stop`; `samples` holds
    (time.time() at the request, seconds or None for a failure)."""

    def __init__(self, host: str, port: int, token: str, every: float = 0.5) -> None:
        self.samples: list[tuple[float, float | None]] = []
        self._stopped = threading.Event()
        self._args = (host, port, token)
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            asked = time.time()
            self.samples.append((asked, status_latency(*self._args)))
            self._stopped.wait(max(0.0, self._every - (time.time() - asked)))

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(15)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Requests made in [start, end): their count, failures, median, p99 and max seconds
        (a failure counts as the request's full timeout in p99 and max), and the slowest five
        as [seconds after `start` when asked, seconds taken]."""
        taken = [s for t, s in self.samples if start <= t < end]
        times = sorted(10.0 if s is None else s for s in taken)
        if not times:
            return {"requests": 0}
        return {
            "requests": len(taken),
            "failures": sum(s is None for s in taken),
            "median_s": round(times[len(times) // 2], 4),
            "p99_s": round(times[min(len(times) - 1, int(0.99 * len(times)))], 4),
            "max_s": round(times[-1], 4),
            "slowest": [
                [round(t - start, 2), round(10.0 if s is None else s, 3)]
                for t, s in sorted(
                    ((t, s) for t, s in self.samples if start <= t < end),
                    key=lambda sample: -10.0 if sample[1] is None else -sample[1],
                )[:5]
            ],
        }
