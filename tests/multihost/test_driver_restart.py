"""A driver SIGKILLed and started again on the multi-host bed (`--backend etcd`): the workers
on the bed's hosts, reached through ssh, run detached; they train on without a driver, and
the restarted driver re-adopts them through ssh (no worker restarted), relays the rest of
their output, and the job ends with every sample trained exactly once per epoch."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.multihost.bed import Bed
from tests.multihost.bed_job import BedJob, workers_on
from tests.support.etcd_server import EtcdServer

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(240)]


def test_remote_workers_train_on_without_the_driver_and_the_restarted_one_adopts_them(
    bed: Bed, bed_job: Callable[..., BedJob], etcd: EtcdServer
) -> None:
    job = bed_job("--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", "bed")
    job.training_at(3, after=0.0)
    workers = {host.name: workers_on(bed, host.name) for host in bed.hosts}
    assert all(len(pids) == 1 for pids in workers.values()), workers

    job.kill_driver()
    killed = time.time()
    # No driver: the workers on every host go on training.
    job.step(lambda s: s.t > killed + 2.0 and s.size == 3, 30, "training without a driver")
    assert {h: workers_on(bed, h) for h in workers} == workers

    second = job.start_driver()
    second.wait_for(r"resuming job bed at round \d+: 3 worker\(s\) to re-adopt", timeout=60)
    resumed = time.time()
    job.step(lambda s: s.t > resumed + 1.0 and s.size == 3, 30, "training after the restart")
    assert {h: workers_on(bed, h) for h in workers} == workers, "no worker was restarted"
    assert "worker pid=" not in second.output
    job.finish()
    assert all(workers_on(bed, h) == [] for h in workers), "no worker outlives the job"
