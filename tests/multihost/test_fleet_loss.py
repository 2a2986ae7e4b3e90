"""Every host of the bed vanishing at once: the job resumes from its durable commit, with the
driver that saw it happen, and (`--backend etcd`) with a driver started again after it.

The checkpoint directory is a path every host sees (the namespaces share this machine's file
system, as hosts share a network one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from elastic.state.durable import CheckpointDir
from tests.multihost.bed import Bed
from tests.multihost.bed_job import BedJob
from tests.support.etcd_server import EtcdServer

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]


def newest_durable_step(directory: CheckpointDir, timeout: float = 30.0) -> tuple[int, int]:
    """(commit, training step) of the newest durable commit, waiting for a first one."""
    deadline = time.monotonic() + timeout
    while not directory.commits():
        assert time.monotonic() < deadline, "no durable commit was written"
        time.sleep(0.1)
    checkpoint = directory.newest()
    assert checkpoint is not None
    return checkpoint.commit, checkpoint.payload["objects"]["step"]


@pytest.mark.parametrize("driver", ["kept", pytest.param("restarted", marks=pytest.mark.slow)])
def test_a_fleet_lost_at_once_resumes_from_its_durable_commit(
    bed: Bed, bed_job: Callable[..., BedJob], tmp_path: Path, driver: str, request
) -> None:
    directory = CheckpointDir(str(tmp_path / "ckpt"))
    flags = ["--checkpoint-dir", directory.url, "--elastic-timeout", "120"]
    if driver == "restarted":
        etcd: EtcdServer = request.getfixturevalue("etcd")
        flags += ["--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", "lost"]
    job = bed_job(*flags)
    started = job.training_at(3, after=0.0, timeout=120)
    newest_durable_step(directory)
    # Long enough for the driver to have heard of commits from the heartbeats (a fleet lost
    # before its first commit ends the job: the script fails before it can commit).
    job.training_at(3, after=started.t + 2.0, timeout=30)
    job.side.poll()
    old_fleet = {s.pid for s in job.side.steps}
    if driver == "restarted":
        job.kill_driver()
    bed.vanish_together([host.name for host in bed.hosts])
    commit, step = newest_durable_step(directory)  # nothing writes any more
    if driver == "kept":
        job.launcher_says(r"every worker of the job failed: new workers resume from the newest "
                          r"durable commit", timeout=20)  # fmt: skip
    for host in bed.hosts:
        bed.back(host.name)
    if driver == "restarted":
        job.start_driver()
    first = job.step(lambda s: s.pid not in old_fleet, timeout=150, why="a new fleet's step")
    assert first.step == step + 1, f"resumed at step {first.step}, durable commit {commit}"
    job.launcher_says(rf"resuming from durable commit {commit} in {directory.url}", timeout=5)
    job.training_at(3, after=first.t, timeout=90)
    job.finish()  # every sample exactly once per epoch across the loss
