"""The two systems as bench/host_faults.py and bench/goodput.py run them on the multi-host bed,
and what a trial leaves on the bed.

* `ElasticrunOnBed`: the driver in the root namespace, the bed's hosts from a discovery file,
  every worker started through the bed's ssh;
* `TorchrunOnBed`: a rendezvous store of its own in the root namespace
  (bench/support/torchrun_store.py), then one agent per host, in the host's namespace (`Bed.start`),
  tuned as in bench/recovery.py plus what the bed needs (`torchrun_needs` says what
  and why).

Both start their processes in `start()` (recorded in `launchers` as they start, so that a
start that fails halfway is still stopped), and react to the cloud's word on a host:
`host_noticed(host, at)` (a preemption notice: elasticrun's discovery line says `leaving=T`;
torchrun has no use for it), `host_gone(host)` (reclaimed: discovery drops it) and
`host_returned(host)` (back, or allocated: listed again in elasticrun's discovery file,
nothing changing for a host that never left it; a fresh agent for torchrun).
`namespace_leftovers` checks the hosts once a trial's launchers stopped; `clean_up` ends a
trial (launchers stopped, the bed closed, what was left reported) and `leftovers` counts what
it found.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.support.local_systems import (
    ELASTIC_WORKLOAD,
    HOSTS_FILE_SCRIPT,
    TORCHRUN_WORKLOAD,
    TUNED_MONITOR_INTERVAL,
    TUNED_RDZV_CONF,
    make_systems,
    worker_args,
    write_hosts,
)
from bench.support.paths import ROOT
from bench.support.trial_processes import LEFTOVER_TIMEOUT, Launcher, Output, TrialFailed, stop_all
from tests.multihost.bed import Bed
from tests.multihost.leftovers import survey

HOSTS = 4
HEARTBEAT = 0.5
DISCOVERY_INTERVAL = 0.5
COOLDOWN = (1.0, 2.0)  # elasticrun's --blacklist-cooldown-range (see NOTES in bench/host_faults.py)
START_TIMEOUT = 60  # elasticrun's --start-timeout: ssh answering and workers joining
PG_TIMEOUT = 5.0  # the torchrun workload's init_process_group timeout (see torchrun_needs)
# Added to TUNED_RDZV_CONF: no agent serves the store; an agent's store call gives up after
# read_timeout s (default 60). keep_alive_max_attempt stays at its 3 (see torchrun_needs).
RDZV_ON_BED = "is_host=false,read_timeout=5"
WORKER_MAX_SECONDS = 300.0  # the workers' safety timer: none outlives a killed benchmark


def torchrun_needs(pg_timeout: float) -> list[str]:
    """What torchrun needed on the bed, each with why (the JSON's `torchrun.needed`)."""
    timeout = f"{pg_timeout:g} s" if pg_timeout else "torch's default"
    return [
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as in bench/recovery.py: without it a "
        "restarted or new agent re-reads stale rendezvous keys and cannot join",
        "--local-addr=<the host's address>: every bed host has the machine's host name, which "
        "resolves to loopback, and torchrun hands it to the workers as MASTER_ADDR (without "
        "it, tried here on 2 hosts: no step, the workers time out connecting to the store)",
        "GLOO_SOCKET_IFNAME=eth0 for the workers: Gloo binds the address the host name "
        "resolves to (loopback) unless told which interface to use (without it, tried here: "
        "no step, Gloo connects to 127.0.0.1); elasticrun's workers pick the interface that "
        "routes to the driver themselves",
        "a rendezvous endpoint on no host that can fail: a TCPStore process of its own in the "
        "root namespace, every agent with --rdzv-conf is_host=false; by default the agent on "
        "the endpoint's host serves the store, and the job cannot outlive that host",
        f"init_process_group(timeout=...) in the training script, here {timeout} "
        "(--torchrun-pg-timeout): a vanished peer never answers nor closes its connections, "
        "so the survivors sit in their allreduce until the process group's timeout, torch's "
        "default 30 minutes for Gloo (with it, host_vanish did not recover within the bound "
        "here: `--torchrun-pg-timeout 0`); a short one fails any step that is slow for once",
        "--rdzv-conf read_timeout=5 (default 60), meant to bound how long an agent cut off "
        "from the store blocks: in driver_partition one store call timed out after 5 s and "
        "the next one blocked until the partition healed, so the cut-off agent never gave up "
        "and torchrun never re-formed (its training went on at size 4; see not_recovered)",
        "keep_alive_interval=1 (default 5, as in bench/recovery.py) with "
        "keep_alive_max_attempt left at 3: a node is dropped 3 s after its last keep-alive. "
        "With 2, once here, the returning host's agent took the busy incumbents for dead and "
        "formed a second job of its own (size 1) beside them, both writing the checkpoint",
    ]


def _elasticrun_exe() -> list[str]:
    exe = shutil.which("elasticrun")
    return [exe] if exe else [sys.executable, "-m", "elastic.driver.cli"]


def _torchrun_exe() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def this_checkout(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout first on PYTHONPATH: an installed `elasticrun` or `torchrun`
    script then runs this checkout's `elastic`, as the workers on the bed do."""
    path = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(env, PYTHONPATH=os.pathsep.join(path))


class ElasticrunOnBed:
    """elasticrun's driver in the root namespace; the bed's hosts from a discovery file.

    `hosts` are those offered at the start (default: all), `flags` go to elasticrun before the
    command, `workload` after the workload's own arguments (a later flag wins)."""

    def __init__(
        self,
        bed: Bed,
        folder: Path,
        out: Output,
        settings: argparse.Namespace,
        *,
        hosts: Sequence[str] = (),
        flags: Sequence[str] = (),
        workload: Sequence[str] = (),
    ):
        self.bed, self.folder, self.out = bed, folder, out
        self.launchers: list[Launcher] = []  # every process started, to stop
        self.agents = self.launchers  # those whose exit ends a wait
        self.commands: dict[str, str] = {}
        self.offered: dict[str, float | None] = {  # host -> when it goes (a notice), if known
            name: None for name in (hosts or [host.name for host in bed.hosts])
        }
        self.flags, self.workload = list(flags), list(workload)
        self.hosts_file = folder / "hosts"

    def _offer(self) -> list[str]:
        lines = []
        for name, leaving in self.offered.items():
            notice = "" if leaving is None else f" leaving={leaving:.3f}"
            lines.append(f"{self.bed.address(name)}:1{notice}")
        write_hosts(self.hosts_file, lines)
        return lines

    def start(self) -> None:
        lines = self._offer()
        env = dict(make_systems()["elasticrun"].env, ELASTIC_HOSTS_FILE=str(self.hosts_file))
        env = this_checkout(env)
        low, high = COOLDOWN
        cmd = [
            *_elasticrun_exe(),
            "-np", str(len(self.offered)), "--min-np", "1", "--max-np", str(len(self.bed.hosts)),
            "--host-discovery-script", str(HOSTS_FILE_SCRIPT),
            "--discovery-interval", str(DISCOVERY_INTERVAL),
            "--heartbeat-interval", str(HEARTBEAT),
            "--blacklist-cooldown-range", str(low), str(high),
            "--start-timeout", str(START_TIMEOUT),
            *self.bed.ssh_args(), *self.flags,
            sys.executable, str(ELASTIC_WORKLOAD),
            *worker_args(self.folder, WORKER_MAX_SECONDS), *self.workload,
        ]  # fmt: skip
        self.launchers.append(Launcher("elasticrun", cmd, env, self.out, ROOT))
        self.commands = {
            "launch": f"OMP_NUM_THREADS=1 ELASTIC_HOSTS_FILE={self.hosts_file} {' '.join(cmd)}",
            "hosts file": ", ".join(lines),
        }

    def host_noticed(self, host: str, leaving_at: float) -> None:
        """The cloud announced `host`'s reclaim at `leaving_at` (Unix time): its discovery
        line says so."""
        self.offered[host] = leaving_at
        self._offer()

    def host_gone(self, host: str) -> None:
        """`host` was reclaimed: discovery no longer lists it."""
        self.offered.pop(host, None)
        self._offer()

    def host_returned(self, host: str) -> None:
        """`host` is (back) in discovery, without a notice; nothing changes for a host that
        never left it."""
        if self.offered.get(host, "absent") is not None:
            self.offered[host] = None
            self._offer()


class TorchrunOnBed:
    """A rendezvous store in the root namespace, then one torchrun agent per bed host."""

    def __init__(
        self,
        bed: Bed,
        folder: Path,
        out: Output,
        settings: argparse.Namespace,
        *,
        hosts: Sequence[str] = (),
        workload: Sequence[str] = (),
        rdzv_on_bed: str = RDZV_ON_BED,
    ):
        """`hosts` get an agent at the start (default: all); `workload` goes after the
        workload's own arguments (a later flag wins); `rdzv_on_bed` is added to the tuned
        rendezvous settings."""
        self.bed, self.folder, self.out = bed, folder, out
        self.hosts = list(hosts) or [host.name for host in bed.hosts]
        self.workload = list(workload)
        self.rdzv_on_bed = rdzv_on_bed
        self.pg_timeout = settings.torchrun_pg_timeout
        # torchrun's temporary folders in the trial's folder; Gloo on the bed's wire.
        tuned = make_systems()["torchrun_tuned"].env
        self.env = this_checkout(dict(tuned, TMPDIR=str(folder), GLOO_SOCKET_IFNAME="eth0"))
        self.run_id = f"bench-{uuid.uuid4().hex[:8]}"
        self.endpoint = ""
        self.launchers: list[Launcher] = []  # every process started, to stop
        self.agents: list[Launcher] = []  # those whose exit ends a wait
        self.commands: dict[str, str] = {}

    def start(self) -> None:
        store_cmd = [sys.executable, "-m", "bench.support.torchrun_store", "--max-seconds", "900"]
        store = Launcher("store", store_cmd, self.env, self.out, ROOT)
        self.launchers.append(store)
        serving = self.out.wait(
            "the rendezvous store",
            lambda o: next(
                (m for x in o.lines if (m := re.match(r"serving (\d+)$", x.text))), None
            ),
            30.0,
            [store],
        )
        self.endpoint = f"{self.bed.driver_address}:{serving[1]}"
        for host in self.hosts:
            self._start_agent(host)
        self.commands = {
            "rendezvous store (root namespace)": " ".join(store_cmd),
            "agent (in each host's namespace, HOST = its address)": (
                "OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 LOGLEVEL=INFO "
                "GLOO_SOCKET_IFNAME=eth0 " + " ".join(self._agent_cmd("HOST"))
            ),
        }

    def _agent_cmd(self, address: str) -> list[str]:
        extra = [] if self.pg_timeout == 0 else ["--pg-timeout", f"{self.pg_timeout:g}"]
        return [
            *_torchrun_exe(),
            f"--nnodes=1:{len(self.bed.hosts)}", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}",
            "--max-restarts=1000", f"--local-addr={address}",
            f"--rdzv-conf={TUNED_RDZV_CONF},{self.rdzv_on_bed}",
            f"--monitor-interval={TUNED_MONITOR_INTERVAL}",
            str(TORCHRUN_WORKLOAD), *worker_args(self.folder, WORKER_MAX_SECONDS), *extra,
            *self.workload,
        ]  # fmt: skip

    def _start_agent(self, host: str) -> None:
        again = any(a.name == f"agent-{host}" for a in self.agents)
        name = f"agent-{host}-again" if again else f"agent-{host}"
        cmd = self._agent_cmd(self.bed.address(host))
        start = functools.partial(self.bed.start, host)
        agent = Launcher(name, cmd, self.env, self.out, ROOT, start=start)
        self.agents.append(agent)
        self.launchers.append(agent)

    def host_noticed(self, host: str, leaving_at: float) -> None:
        """Nothing: torchrun has no use for a notice."""

    def host_gone(self, host: str) -> None:
        """Nothing: the agent went with its host."""

    def host_returned(self, host: str) -> None:
        """A returned host's service manager starts its agent again."""
        self._start_agent(host)


SYSTEM_CLASSES = {"elasticrun": ElasticrunOnBed, "torchrun": TorchrunOnBed}


def host_of(bed: Bed, pid: int) -> str:
    """The bed host whose namespace runs `pid`."""
    for host in bed.hosts:
        if pid in bed.pids(host.name):
            return host.name
    raise TrialFailed(f"process {pid} is in no bed host")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def namespace_leftovers(bed: Bed) -> dict[str, list[str]]:
    """Processes left in the bed's hosts but their sshd listeners, by host, after waiting up
    to LEFTOVER_TIMEOUT s for them to go; those left are SIGKILLed."""
    deadline = time.monotonic() + LEFTOVER_TIMEOUT

    def left() -> dict[int, tuple[str, str]]:
        found = {}
        for host in bed.hosts:
            for pid in bed.pids(host.name):
                command = " ".join(_cmdline(pid)).strip()
                # The listener names its config in the bed's folder (sshd rewrites its title).
                if command and not ("sshd" in command and str(bed.directory) in command):
                    found[pid] = (host.name, command[:300])
        return found

    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    by_host: dict[str, list[str]] = {}
    for pid, (host, argv) in found.items():
        by_host.setdefault(host, []).append(f"{pid}: {argv}")
    return by_host


def clean_up(
    folder: Path, bed: Bed | None, job: ElasticrunOnBed | TorchrunOnBed | None, cut: str | None
) -> dict[str, Any]:
    """After a trial: heal the `cut` host (partitions end; elasticrun then tells the stale
    worker to go), stop every launcher, check that nothing is left in the root namespace
    (`stop_all`: no process names the trial's folder) nor in the hosts, and close the bed,
    checking that its namespaces, links and nft table are gone. Never raises: what went wrong
    is in the returned record."""
    errors = []
    if bed is not None and cut is not None:
        try:
            bed.heal(cut)
        except Exception as err:  # noqa: BLE001 - stop the launchers whatever happened
            errors.append(f"heal {cut}: {err}")
    stop = stop_all(job.launchers if job else [], str(folder))
    if bed is not None:
        stop["namespace_leftovers"] = namespace_leftovers(bed)
        made = bed.names()
        try:
            bed.close()
        except Exception as err:  # noqa: BLE001 - reported; the next bed sweeps what is left
            errors.append(f"closing the bed: {err}")
        stop["bed_remains"] = sorted(made & survey().names())
    if errors:
        stop["errors"] = errors
    return stop


def leftovers(record: dict[str, Any]) -> int:
    stop = record["stop"]
    in_namespaces = sum(len(v) for v in stop.get("namespace_leftovers", {}).values())
    bed = len(stop.get("bed_remains", []))
    return len(stop["leftover_processes_sigkilled"]) + in_namespaces + bed
