"""The systems the one-machine benchmarks compare, as they launch them: elasticrun (hosts
from a discovery file) and torchrun (one agent per simulated node, with its defaults or
tuned), each running the tiny workload of `bench/workloads/`.

Both workloads train the same MLP and commit (elasticrun, in memory) or checkpoint (torchrun,
rank 0 to a file) every `COMMIT_EVERY` steps. The hosts of elasticrun's discovery file are
local names of this machine (`localhost`, `127.0.0.1`, and `third_host()` at scale-up), so
that a killed worker's host-mates are distinct hosts.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.support.paths import ROOT, WORKLOADS

ELASTIC_WORKLOAD = WORKLOADS / "tiny_elastic.py"
TORCHRUN_WORKLOAD = WORKLOADS / "tiny_torchrun.py"
HOSTS_FILE_SCRIPT = ROOT / "discovery_scripts" / "hosts_file.sh"
TUNED_RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,join_timeout=60"
TUNED_MONITOR_INTERVAL = "0.1"
COMMIT_EVERY = 5
WORKER_MAX_SECONDS = 240.0  # the workers' safety timer: no worker outlives a killed benchmark


def third_host() -> tuple[str, str]:
    """The discovery line added at scale-up, and why: this machine's hostname if it resolves
    to a local address (a third distinct host name), else `localhost:2`."""
    from elastic.driver.launch.network import is_local, local_addresses

    name = socket.gethostname()
    try:
        if name not in ("localhost", "127.0.0.1") and is_local(name, local_addresses()):
            return f"{name}:1", f"the hostname {name!r} resolves to a local address"
    except Exception as err:  # noqa: BLE001 - any failure means: not usable
        return "localhost:2", f"the hostname {name!r} is not usable ({err})"
    return "localhost:2", f"the hostname {name!r} is not a third local name"


def write_hosts(path: Path, lines: list[str]) -> None:
    staged = path.with_suffix(".new")
    staged.write_text("".join(f"{line}\n" for line in lines))
    staged.replace(path)  # atomic: the discovery script never reads half a file


# --- one system's scenario ------------------------------------------------------------------


@dataclass
class System:
    """How to launch and grow one system; `kind` is "elasticrun" or "torchrun"."""

    name: str
    kind: str
    env: dict[str, str]
    torchrun_extra: list[str] = field(default_factory=list)
    observed: bool = False  # an operator scrapes its metrics and polls its status meanwhile
    elastic_extra: list[str] = field(default_factory=list)  # more elasticrun flags
    commit_every: int = COMMIT_EVERY

    def elasticrun_cmd(self, folder: Path) -> list[str]:
        exe = shutil.which("elasticrun")
        return [
            *([exe] if exe else [sys.executable, "-m", "elastic.driver.cli"]),
            "-np", "2", "--min-np", "1", "--max-np", "3",
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT),
            "--discovery-interval", "0.2", "--failure-scope", "worker", *self.elastic_extra,
            sys.executable, str(ELASTIC_WORKLOAD),
            *worker_args(folder, commit_every=self.commit_every),
        ]  # fmt: skip

    def torchrun_cmd(self, folder: Path, port: int, run_id: str) -> list[str]:
        exe = shutil.which("torchrun")
        return [
            *([exe] if exe else [sys.executable, "-m", "torch.distributed.run"]),
            "--nnodes=1:3", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
            "--max-restarts=1000",
            *self.torchrun_extra,
            str(TORCHRUN_WORKLOAD), *worker_args(folder, commit_every=self.commit_every),
        ]  # fmt: skip


def worker_args(
    folder: Path, max_seconds: float = WORKER_MAX_SECONDS, commit_every: int = COMMIT_EVERY
) -> list[str]:
    """The workloads' arguments (both systems, and the multi-host benchmark's); `max_seconds`
    is the workers' safety timer, `commit_every` the steps between two commits (elasticrun)
    or checkpoints (torchrun)."""
    return ["--out", str(folder), "--commit-every", str(commit_every),
            "--max-seconds", str(max_seconds)]  # fmt: skip


def make_systems(commit_every: int = COMMIT_EVERY) -> dict[str, System]:
    """The systems by name, committing (or checkpointing) every `commit_every` steps:
    `elasticrun_rollback_commit` is elasticrun under `--rollback commit` (Horovod's rollback
    to the last commit), beside `elasticrun` (the default, `--rollback step`)."""
    base = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # LOGLEVEL=INFO: the agents log their rendezvous rounds and restarts (milestones)
    torch_env = dict(base, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="INFO")
    systems = [
        System("elasticrun", "elasticrun", base),
        System(
            "elasticrun_rollback_commit", "elasticrun", base, elastic_extra=["--rollback", "commit"]
        ),  # fmt: skip
        System("elasticrun_observed", "elasticrun", base, observed=True),
        System(
            "torchrun_tuned",
            "torchrun",
            torch_env,
            [f"--rdzv-conf={TUNED_RDZV_CONF}", f"--monitor-interval={TUNED_MONITOR_INTERVAL}"],
        ),
        System("torchrun_default", "torchrun", torch_env),
    ]
    for system in systems:
        system.commit_every = commit_every
    return {system.name: system for system in systems}
