"""How much CPU other processes took while a benchmark ran (the machine may be shared).

`OtherLoad` samples every process's CPU time from /proc once a second in a thread and adds up
the time of those that are not the benchmark's: not this process, not a pid given to `own`,
and not naming `marker` (the benchmark's temporary folder) on their command line. A process
seen only between two samples is missed; the figure is a lower bound.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_cpu_seconds(stat: str) -> float:
    """User + system CPU seconds (all threads) from the text of /proc/PID/stat."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process `pid` has used so far, all threads (None: it is gone)."""
    try:
        return _stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def process_memory_mib(pid: int) -> dict[str, float]:
    """Resident memory of process `pid` now (`rss_mib`) and at its peak (`peak_rss_mib`);
    empty when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            key = "rss_mib" if name == "VmRSS" else "peak_rss_mib"
            found[key] = round(int(value.split()[0]) / 1024, 1)
    return found


def _cpu_times() -> dict[int, tuple[float, str]]:
    """pid -> (user + system CPU seconds, command line) of every readable process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cpu = _stat_cpu_seconds((entry / "stat").read_text())
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry.name)] = (cpu, argv)
    return found


class OtherLoad:
    def __init__(self, marker: str, interval: float = 1.0) -> None:
        self.marker = marker
        self.own: set[int] = {os.getpid()}
        self._interval = interval
        self._windows: list[float] = []  # % of one core taken by others, per interval
        self._others: dict[int, str] = {}  # pid -> command line, of those that took > 1 %
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _theirs(self, pid: int, argv: str) -> bool:
        return pid not in self.own and self.marker not in argv

    def _run(self) -> None:
        before, t0 = _cpu_times(), time.monotonic()
        while not self._stop.wait(self._interval):
            now, t1 = _cpu_times(), time.monotonic()
            spent = 0.0
            for pid, (cpu, argv) in now.items():
                if not self._theirs(pid, argv):
                    continue
                delta = cpu - before.get(pid, (cpu, ""))[0]
                spent += delta
                if delta > 0.01 * (t1 - t0):
                    self._others[pid] = argv[:160]
            self._windows.append(100 * spent / (t1 - t0))
            before, t0 = now, t1

    def __enter__(self) -> OtherLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def mark(self) -> int:
        """A point in the samples, for `mean_since`."""
        return len(self._windows)

    def mean_since(self, mark: int) -> float | None:
        """Mean % of one core that other processes took since `mark` (None: no sample)."""
        windows = self._windows[mark:]
        return round(sum(windows) / len(windows), 1) if windows else None

    def summary(self) -> dict[str, object]:
        """Mean and max % of one core that other processes took, and the busiest of them."""
        windows = self._windows or [0.0]
        return {
            "other_processes_cpu_pct_mean": round(sum(windows) / len(windows), 1),
            "other_processes_cpu_pct_max_1s": round(max(windows), 1),
            "seconds_with_other_load_over_50pct": sum(w > 50 for w in windows),
            "other_processes_seen": sorted(set(self._others.values()))[:10],
        }
