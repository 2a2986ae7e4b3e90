"""`tests/support/workers/soak_job.py` as a real `elasticrun` job on the multi-host bed's hosts.

The driver runs in the root namespace; hosts come from a discovery file, one slot each, and
are reached through ssh. Each worker appends its step lines (with the wall-clock time its
allreduce returned) to a side file of its own, which is how a test sees training go on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.multihost.bed import Bed
from tests.support.running_job import RunningJob
from tests.support.soak import HOSTS_FILE_SCRIPT, SOAK_JOB, SideFiles, StepLine, dump_stacks

HEARTBEAT = 0.5
MISSES = 3
# What a test allows recovery to take: far below every timeout that could end a wait
# instead (the collective timeout is 1800 s, Gloo's connection timeout 2 s x 5, ssh's 30 s).
RECOVERY_LIMIT = 8.0


class BedJob:
    """`soak_job.py` on the bed's hosts (one slot each), from a discovery file."""

    def __init__(
        self,
        bed: Bed,
        elasticrun: Callable[..., RunningJob],
        folder: Path,
        *extra: str,
    ) -> None:
        self.bed = bed
        self.folder = folder
        self.side = SideFiles(folder / "side")
        self.side.folder.mkdir()
        self.stop_file = folder / "stop"
        self.hosts_file = folder / "hosts"
        self.hosts_file.write_text("".join(f"{h.address}:1\n" for h in bed.hosts))
        n = len(bed.hosts)
        self._elasticrun = elasticrun
        self.args = [
            "-np", str(n), "--min-np", "1", "--max-np", str(n),
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT), "--discovery-interval", "0.5",
            "--heartbeat-interval", str(HEARTBEAT), "--collective-timeout", "1800",
            "--blacklist-cooldown-range", "2", "4", "--start-timeout", "60",
            *bed.ssh_args(), *extra,
            sys.executable, str(SOAK_JOB), "--out", str(folder),
            "--side-dir", str(self.side.folder), "--stop-file", str(self.stop_file),
            "--step-delay", "0.05", "--samples", "96",
        ]  # fmt: skip
        self.env = {"ELASTIC_HOSTS_FILE": str(self.hosts_file)}
        self.drivers = [elasticrun(self.args, self.env)]
        self.driver_down = False  # killed by `kill_driver`, not started again yet

    @property
    def job(self) -> RunningJob:
        """The newest driver's run."""
        return self.drivers[-1]

    def kill_driver(self) -> None:
        """SIGKILL the driver (its process group: not the workers, which run elsewhere)."""
        os.kill(self.job.process.pid, signal.SIGKILL)
        self.job.process.wait()
        self.driver_down = True

    def start_driver(self) -> RunningJob:
        """Start the driver again with the same command (the etcd backend resumes the job)."""
        self.drivers.append(self._elasticrun(self.args, self.env))
        self.driver_down = False
        return self.job

    def step(self, wanted: Callable[[StepLine], bool], timeout: float, why: str) -> StepLine:
        """The first step line that is `wanted`, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        while True:
            self.side.poll()
            found = [s for s in self.side.steps if wanted(s)]
            if found:
                return min(found, key=lambda s: s.t)
            ended = not self.driver_down and self.job.process.poll() is not None
            if time.monotonic() > deadline or ended:
                raise AssertionError(f"{why}: no such step within {timeout:g} s\n{self.tail()}")
            time.sleep(0.05)

    def steps_between(self, first: float, last: float) -> list[StepLine]:
        self.side.poll()
        return [s for s in self.side.steps if first <= s.t <= last]

    def training_at(self, size: int, after: float, timeout: float = 90.0) -> StepLine:
        return self.step(lambda s: s.size == size and s.t > after, timeout, f"size {size}")

    def finish(self) -> dict:
        """Stop the job at its next epoch; its exit code must be 0 and every sample trained
        exactly once per epoch. Returns the result rank 0 wrote."""
        self.stop_file.touch()
        try:
            code = self.job.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            dump_stacks(self.folder, "the job did not stop within 120 s")
            raise AssertionError(f"the job did not stop within 120 s\n{self.tail()}") from None
        assert self.job.finish(timeout=30) == code == 0, self.tail()
        result = json.loads((self.folder / "result.json").read_text())
        assert set(result["counts"]) == {float(result["epochs"])}, result
        return result

    def tail(self, lines: int = 60) -> str:
        self.job.drain()
        return "\n".join(self.job.lines[-lines:])

    def launcher_output(self) -> str:
        """Everything the launcher wrote to stderr so far."""
        self.job.drain()
        return "\n".join(self.job.stderr)

    def launcher_says(self, pattern: str, timeout: float = 10.0) -> str:
        return self.job.wait_for(pattern, timeout=timeout).group(0)


def workers_on(bed: Bed, host: str) -> list[int]:
    """The training processes (not sshd, not the agent) running in `host`'s namespace."""
    found = []
    for pid in bed.pids(host):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"soak_job.py") for part in command) and b"-m" not in command[1:2]:
            found.append(pid)
    return found
