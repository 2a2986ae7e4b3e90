"""The two jobs the sharded recovery benchmark compares, as it launches, grows and hurts them:
the FSDP2 workload of `bench/workloads/` on 4 ranks over 2 host names, under elasticrun
(`ShardedState`, commits in memory replicated to the other host) and under torchrun (a DCP
checkpoint on local disk), both tuned as in `bench/recovery.py`.

* `ElasticJob`: `elasticrun -np 4 --min-np 1 --max-np 4 --failure-scope worker`, its hosts
  from a discovery file (`localhost:2`, `127.0.0.1:2`); a host whose worker failed gets no
  new worker for `COOLDOWN` s, so that no slot is refilled behind the benchmark's back: the
  only grow is the one it makes (a third host name in the file);
* `TorchrunJob`: 2 agents (`--nnodes=1:2 --nproc-per-node=2`), the c10d rendezvous on a
  TCPStore of its own (`bench/support/torchrun_store.py`, every agent `is_host=false`: an
  agent that serves the store would take it with it when its "host" goes), the tuned
  rendezvous and monitor settings of `bench/support/local_systems.py`.

One machine has no hosts to lose: a host "vanishes" here as all its worker processes (and,
for torchrun, its agent) SIGKILLed at one instant, and for elasticrun its name removed from
the discovery file at that instant. Their sockets close, so peers learn of it at once, which
a real lost host does not grant (`bench/host_faults.py` measures that on the multi-host bed).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import uuid
from pathlib import Path

from bench.support.child_processes import child_env
from bench.support.local_systems import (
    HOSTS_FILE_SCRIPT,
    TUNED_MONITOR_INTERVAL,
    TUNED_RDZV_CONF,
    write_hosts,
)
from bench.support.paths import ROOT, WORKLOADS
from bench.support.trial_processes import Launcher, Output, stop_all

ELASTIC_WORKLOAD = WORKLOADS / "sharded_elastic.py"
TORCHRUN_WORKLOAD = WORKLOADS / "sharded_torchrun.py"
HOSTS = ["localhost:2", "127.0.0.1:2"]  # two host names, two ranks each
COOLDOWN = "900"  # s: --blacklist-cooldown-range MIN MAX, both
READY = re.compile(r"event ready size \d+ rank (\d+) host (\S+) pid (\d+)")


def base_env() -> dict[str, str]:
    return dict(child_env(), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def children(pid: int) -> list[int]:
    """The live children of process `pid` (a /proc scan)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] != "Z":
            found.append(int(entry.name))
    return found


def sigkill(pids: list[int]) -> None:
    """SIGKILL every process of `pids` (one already gone is skipped), in one go."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class ElasticJob:
    """The workload under elasticrun in `folder` (see the module's docstring)."""

    kind = "elasticrun"

    def __init__(self, folder: Path, out: Output, workload: list[str]) -> None:
        self.folder, self.out = folder, out
        self.hosts_file = folder / "hosts"
        self.hosts = list(HOSTS)
        write_hosts(self.hosts_file, self.hosts)
        self.cmd = [
            sys.executable, "-m", "elastic.driver.cli",
            "-np", "4", "--min-np", "1", "--max-np", "4",
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT), "--discovery-interval", "0.2",
            "--failure-scope", "worker", "--blacklist-cooldown-range", COOLDOWN, COOLDOWN,
            sys.executable, str(ELASTIC_WORKLOAD), "--out", str(folder), *workload,
        ]  # fmt: skip
        env = dict(base_env(), ELASTIC_HOSTS_FILE=str(self.hosts_file), TMPDIR=str(folder))
        self.launchers = [Launcher("elasticrun", self.cmd, env, out, ROOT)]

    def commands(self) -> dict[str, str]:
        return {
            "launch": f"OMP_NUM_THREADS=1 ELASTIC_HOSTS_FILE=hosts {' '.join(self.cmd)}",
            "hosts file": ", ".join(HOSTS),
        }

    def hosts_of(self) -> dict[int, str]:
        """pid -> the host name each worker was started on (its `event ready` line)."""
        with self.out.cond:
            return {int(m[3]): m[2] for line in self.out.lines if (m := READY.search(line.text))}

    def add_host(self, line: str) -> None:
        self.hosts.append(line)
        write_hosts(self.hosts_file, self.hosts)

    def vanish(self, host: str, pids: list[int]) -> None:
        """`host`'s workers `pids` die at once and the discovery file no longer lists it."""
        sigkill(pids)
        self.hosts = [h for h in self.hosts if h.split(":")[0] != host]
        write_hosts(self.hosts_file, self.hosts)

    def stop(self) -> dict:
        return stop_all(self.launchers, str(self.folder))


class TorchrunJob:
    """The workload under torchrun in `folder`: a store, then 2 agents of 2 workers each."""

    kind = "torchrun"

    def __init__(self, folder: Path, out: Output, workload: list[str]) -> None:
        self.folder, self.out, self.workload = folder, out, workload
        self.env = dict(
            base_env(), TMPDIR=str(folder), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            LOGLEVEL="INFO",
        )  # fmt: skip
        store_cmd = [sys.executable, "-m", "bench.support.torchrun_store", "--max-seconds", "3600"]
        self.launchers = [Launcher("store", store_cmd, self.env, out, ROOT)]
        self.agents: list[Launcher] = []
        self.cmd: list[str] = []

    def start(self, wait_s: float) -> None:
        """Once the store serves (within `wait_s`), start the agents."""
        serving = self.out.wait(
            "the rendezvous store",
            lambda o: next((m for x in o.lines if (m := re.match(r"serving (\d+)$", x.text))), 0),
            wait_s,
            self.launchers,
        )
        self.cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{serving[1]}", f"--rdzv-id=bench-{uuid.uuid4().hex[:8]}",
            "--max-restarts=1000", f"--rdzv-conf={TUNED_RDZV_CONF},is_host=false",
            f"--monitor-interval={TUNED_MONITOR_INTERVAL}",
            str(TORCHRUN_WORKLOAD), "--out", str(self.folder), *self.workload,
        ]  # fmt: skip
        self.agents = [Launcher(f"agent{k}", self.cmd, self.env, self.out, ROOT) for k in range(2)]
        self.launchers += self.agents

    def commands(self) -> dict[str, str]:
        return {
            "launch": "OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 LOGLEVEL=INFO "
            + " ".join(self.cmd)
            + "  (twice: 2 agents)",
            "store": "python -m bench.support.torchrun_store (the rendezvous endpoint)",
        }

    def vanish(self, agent: int) -> list[int]:
        """Agent `agent` and its workers die at once; returns their pids."""
        pid = self.agents[agent].process.pid
        pids = [pid, *children(pid)]
        sigkill(pids)
        return pids

    def stop(self) -> dict:
        return stop_all(self.launchers, str(self.folder))
