"""Hosts that vanish, are cut off, or get a slow link, on the multi-host bed.

A real `elasticrun` (the driver in the root namespace) trains `tests/support/workers/soak_job.py` on
three bed hosts, one worker each, reached through ssh; hosts come from a discovery file. The
faults act on the wire (tests/multihost/bed.py): nothing tells anyone, as when a spot
instance disappears. Each worker appends its step lines (with the wall-clock time its
allreduce returned) to a side file, which is how the tests see training go on.

Times printed here are what one run measured; `bench/host_faults.py` measures them properly.
The tests assert what a user would check: training goes on at the right size, long before
any timeout, every sample is trained exactly once per epoch, nothing is left running.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.bed import Bed
from tests.multihost.bed_job import HEARTBEAT, MISSES, RECOVERY_LIMIT, BedJob, workers_on
from tests.support.running_job import RunningJob
from tests.support.soak import SOAK_JOB

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(240)]


def test_a_vanished_host_is_left_behind_after_the_missed_heartbeats_and_comes_back(
    bed: Bed, bed_job: Callable[..., BedJob]
) -> None:
    """h3 loses power mid-step: no RST, no FIN, its ssh session hangs. The driver declares its
    worker dead after 3 missed heartbeats, the survivors abandon their blocked collective on
    the driver's word, and train on at size 2 long before any timeout. When h3 comes back
    (same address, a fresh machine), it gets a worker again after its cooldown."""
    job = bed_job()
    job.training_at(3, after=0.0)
    time.sleep(1.0)
    vanished = time.time()
    bed.vanish("h3")
    recovered = job.training_at(2, after=vanished, timeout=RECOVERY_LIMIT)
    print(f"host vanished -> next step at size 2: {recovered.t - vanished:.2f} s")
    assert recovered.t - vanished < RECOVERY_LIMIT
    job.launcher_says(rf"host {re.escape(bed.address('h3'))} .*missed {MISSES} heartbeats")
    # The survivors were told, not timed out: no Gloo or TCP timeout ended their collective.
    assert not any("timed out" in line.lower() for line in job.job.lines), job.tail()

    bed.back("h3")
    returned = time.time()
    rejoined = job.training_at(3, after=returned, timeout=60)
    print(f"host back -> training at size 3 again: {rejoined.t - returned:.2f} s")
    job.finish()


def test_partitions_and_a_slow_link(bed: Bed, bed_job: Callable[..., BedJob]) -> None:
    """One job through four faults of h3's wire, in turn:
    * 50 ms delay and 1 % loss: training goes on at size 3, slower, and nobody is declared
      dead;
    * cut off from the driver for less than the heartbeat allowance: no re-form, its worker
      keeps training;
    * cut off from the driver for longer: the driver counts it out and re-forms at size 2;
      when the cut heals its stale worker is told to leave, and there is never more than one
      worker on h3's slot;
    * cut off from its peers only (the driver still hears it): the round breaks on the
      members' probe reports, not on a timeout, and the next round leaves h3 out.
    """
    job = bed_job()
    job.training_at(3, after=0.0)
    start = time.time()
    time.sleep(3.0)
    fast_rate = len(job.steps_between(start, time.time())) / (time.time() - start)

    bed.slow("h3", delay_ms=50, loss_pct=1.0)
    slowed = time.time()
    time.sleep(6.0)
    during = job.steps_between(slowed, time.time())
    slow_rate = len(during) / (time.time() - slowed)
    bed.fast("h3")
    print(f"steps/s of rank 0: {fast_rate / 3:.1f} fast, {slow_rate / 3:.1f} at 50 ms 1 % loss")
    assert during and {s.size for s in during} == {3}, job.tail()
    assert "heartbeats" not in job.launcher_output(), job.tail()

    # A cut shorter than the allowance: nothing happens. The driver hears nothing from the
    # last beat before the cut (up to an interval earlier) to the first one resent after it
    # (a retransmission timeout later, 0.5 s at most here), so the cut is the allowance less
    # both, after 2 s at full speed for TCP's timeout to come down from the slow link's.
    time.sleep(2.0)
    cut = time.time()
    bed.partition("h3", from_="driver")
    time.sleep(HEARTBEAT * MISSES - HEARTBEAT - 0.5)  # 0.5 s
    bed.heal("h3")
    time.sleep(HEARTBEAT * MISSES * 2)
    after_short = job.steps_between(cut, time.time())
    assert after_short and {s.size for s in after_short} == {3}, job.tail()
    assert "heartbeats" not in job.launcher_output(), job.tail()

    # A longer cut: h3 is counted out; on healing its stale worker leaves.
    (stale,) = workers_on(bed, "h3")
    cut = time.time()
    bed.partition("h3", from_="driver")
    recovered = job.training_at(2, after=cut, timeout=RECOVERY_LIMIT)
    print(f"cut from the driver -> next step at size 2: {recovered.t - cut:.2f} s")
    assert stale in workers_on(bed, "h3"), "a partitioned host's worker lives on, unaware"
    bed.heal("h3")
    healed = time.monotonic()
    most_on_slot = 0
    while stale in workers_on(bed, "h3"):
        most_on_slot = max(most_on_slot, len(workers_on(bed, "h3")))
        assert time.monotonic() - healed < 30, "the stale worker was not told to leave"
        time.sleep(0.05)
    print(f"healed -> stale worker gone: {time.monotonic() - healed:.2f} s")
    back = job.training_at(3, after=time.time(), timeout=60)
    assert most_on_slot <= 1, "two workers on h3's one slot"

    # Cut off from its peers only.
    cut = time.time()
    bed.partition("h3", from_="peers")
    recovered = job.training_at(2, after=cut, timeout=RECOVERY_LIMIT + 5)
    print(f"cut from its peers -> next step at size 2: {recovered.t - cut:.2f} s")
    job.launcher_says(rf"host {re.escape(bed.address('h3'))} is unreachable from its peers")
    bed.heal("h3")
    job.training_at(3, after=time.time(), timeout=60)
    del back
    job.finish()


def test_a_host_that_vanishes_during_the_first_launch_fails_the_launch_by_name(
    bed: Bed, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    """A static job whose third host loses power while its worker starts: the launch fails
    within the start timeout (or when ssh's keep-alive gives the session up), with a line
    naming the host; the job's end does not wait on the silent ssh session."""
    hosts = ",".join(f"{host.address}:1" for host in bed.hosts)
    job = elasticrun(
        ["-np", "3", "-H", hosts, *bed.ssh_args(), "--start-timeout", "20",
         sys.executable, str(SOAK_JOB), "--out", str(tmp_path), "--side-dir", str(tmp_path),
         "--stop-file", str(tmp_path / "stop")]
    )  # fmt: skip
    job.wait_for(r"worker pid=", timeout=60)  # the workers are starting
    bed.vanish("h3")
    started = time.monotonic()
    code = job.finish(timeout=60)
    took = time.monotonic() - started
    print(f"vanished during launch -> launcher exit {code} after {took:.1f} s")
    assert code != 0
    assert took < 20 + 10, "the job's end waited on the vanished host"
    # The start timeout, or ssh's keep-alive giving the session up (15 s), whichever first.
    # The line that says why, before the job's summary line.
    last = [line for line in job.stderr if " ended with exit code " not in line][-1]
    assert bed.address("h3") in last, job.transcript()
    assert "did not join the rendezvous within 20 s" in last or "exited with code 255" in last
