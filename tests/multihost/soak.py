"""The fault soak on the multi-host bed: `tests/support/soak.py`'s job and process faults, with the
job's hosts in network namespaces reached through ssh, and the bed's own faults beside them.

The bed's faults, each on one host chosen at random among those up:
- `host_vanish`: power loss (no RST, no FIN), the host back as a fresh machine 1-5 s later;
- `partition_driver`: cut off from the driver for 0.3-4 s (shorter or longer than the
  missed-heartbeat allowance of 1.5 s), its peers still reach it;
- `partition_peers`: cut off from its peers for 1-5 s, the driver still hears it;
- `link_flap`: its wire down for 0.2-1 s;
- `slow_link`: 50 ms delay and 1 % loss on its packets for 2-6 s.
At least one host is always up and in discovery. Everything else (the checks, the plan, the
recovery table) is `Soak`'s; no process of the job may be left in any namespace at the end.
One check is looser: a worker's last output before its host lost its link to the driver may
be lost with the link (`may_lose`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.multihost.bed import Bed
from tests.multihost.wire import Side
from tests.support.soak import WEIGHTS, Soak, StepLine, job_processes

BED_WEIGHTS = {
    **WEIGHTS,
    "host_vanish": 4,
    "partition_driver": 3,
    "partition_peers": 3,
    "link_flap": 2,
    "slow_link": 2,
}
"""The bed soak's fault kinds and their weights: the process faults and the bed's."""

OUTPUT_IN_FLIGHT = 1.0  # seconds of a worker's output that may be on its way to the driver


@dataclass
class BedSoak(Soak):
    """A `Soak` whose hosts are `bed`'s (one per namespace), with the bed's faults."""

    bed: Bed | None = None
    _down: set[str] = field(default_factory=set)  # vanished hosts, not back yet
    _faulted: set[str] = field(default_factory=set)  # hosts cut off or slowed, not healed
    _cut_off: dict[int, float] = field(default_factory=dict)  # pid -> when its link to the
    # driver was first lost (vanish, partition from the driver, flap)

    @property
    def _bed(self) -> Bed:
        assert self.bed is not None, "a BedSoak needs its bed"
        return self.bed

    def _up(self) -> list[str]:
        """Hosts that are neither vanished nor out of discovery."""
        return [h for h in self.config.hosts if h not in self._down and h not in self._removed]

    def _target(self, spare_one: bool) -> str | None:
        """A host to hit: up and not under another wire fault. With `spare_one`, never the
        last host up (pending returns are made first)."""
        if spare_one and len(self._up()) <= 1:
            self._run_pending(lambda what: what.startswith("host back"))
        candidates = [h for h in self._up() if h not in self._faulted]
        if spare_one and len(self._up()) <= 1:
            return None
        return self.rng.choice(candidates) if candidates else None

    def _until(
        self, low: float, high: float, host: str, what: str, undo: Callable[[], None]
    ) -> float:
        """Undo a wire fault of `host` after a random delay (not if it vanished meanwhile)."""
        delay = self.rng.uniform(low, high)

        def end() -> None:
            self._faulted.discard(host)
            if host not in self._down:
                undo()

        self._faulted.add(host)
        self._later(delay, f"{what} {host}", end)
        return delay

    def _losing_driver(self, host: str) -> None:
        """`host`'s link to the driver is lost now: output its workers printed since the
        driver last read it may never reach the launcher."""
        now = time.time()
        for pid in self._bed.pids(host):
            self._cut_off.setdefault(pid, now)

    def may_lose(self, pid: int, line: str) -> bool:
        """Lines a worker printed at most `OUTPUT_IN_FLIGHT` s before its host's link to the
        driver was lost, or after, may be lost with the link (as on a machine that loses
        power, or whose driver declares it dead while cut off); so may those printed since
        the driver was last killed, when the link went before a restarted driver (which
        takes a few seconds to start) re-attached to the worker."""
        since = self._cut_off.get(pid)
        step = StepLine.parse(line)
        if since is None or step is None:
            return False
        restarts = [
            f.at for f in self.faults if f.kind == "driver_restart" and since - 10.0 < f.at < since
        ]
        return step.t >= min([since - OUTPUT_IN_FLIGHT, *restarts])

    def _fault_host_vanish(self) -> str | None:
        host = self._target(spare_one=True)
        if host is None:
            return None
        self.signalled.update(self._bed.pids(host))
        self._losing_driver(host)
        self._bed.vanish(host)
        self._down.add(host)
        self._faulted.discard(host)
        delay = self.rng.uniform(1.0, 5.0)

        def back() -> None:
            self._bed.back(host)
            self._down.discard(host)

        self._later(delay, f"host back {host} (vanished)", back)
        return f"host {host} vanished, back in {delay:.2f} s"

    def _fault_partition_driver(self) -> str | None:
        return self._partition("driver", 0.3, 4.0)

    def _fault_partition_peers(self) -> str | None:
        return self._partition("peers", 1.0, 5.0)

    def _partition(self, side: Side, low: float, high: float) -> str | None:
        """Cut a host off from the driver or from its peers for `low`-`high` seconds (never
        the last host up from its peers: someone must train)."""
        host = self._target(spare_one=side == "peers")
        if host is None:
            return None
        if side == "driver":
            self._losing_driver(host)
        self._bed.partition(host, from_=side)
        delay = self._until(low, high, host, "heal", lambda: self._bed.heal(host))
        whom = "the driver" if side == "driver" else "its peers"
        return f"host {host} cut off from {whom} for {delay:.2f} s"

    def _fault_link_flap(self) -> str | None:
        host = self._target(spare_one=False)
        if host is None:
            return None
        seconds = self.rng.uniform(0.2, 1.0)
        self._losing_driver(host)
        self._bed.flap(host, seconds)
        return f"host {host}'s link down for {seconds:.2f} s"

    def _fault_slow_link(self) -> str | None:
        host = self._target(spare_one=False)
        if host is None:
            return None
        self._bed.slow(host, delay_ms=50, loss_pct=1.0)
        delay = self._until(2.0, 6.0, host, "fast", lambda: self._bed.fast(host))
        return f"host {host} at 50 ms and 1 % loss for {delay:.2f} s"

    def leftovers(self, wait: float = 15.0) -> dict[int, tuple[str, str, list[str]]]:
        """`Soak.leftovers`, and any process in a bed host but its sshd and delay queue."""
        deadline = time.monotonic() + wait
        while True:
            left = job_processes(str(self.folder))
            for host in self._bed.hosts:
                for pid in self._bed.pids(host.name):
                    argv = _argv(pid)
                    if argv and not _bed_own(argv):
                        left.setdefault(pid, ("in " + host.name, "?", argv))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _bed_own(argv: list[str]) -> bool:
    """Whether a process in a bed host is the bed's own (its sshd, its delay queue)."""
    program = argv[0].partition(":")[0]  # "sshd: root@notty" for a login's own process
    return program.endswith("sshd") or any(part.endswith("delay_queue.py") for part in argv)
