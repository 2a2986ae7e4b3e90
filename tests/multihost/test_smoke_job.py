"""A real `elasticrun` job over three bed hosts, each reached through its own sshd.

The driver runs in the root namespace; each rank runs in its own network namespace, where the
host name resolves to loopback: the ranks connect only because the worker makes Gloo bind the
interface that reaches the driver (elastic/worker/group/gloo_interface.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.multihost.bed import Bed
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script
from tests.support.workers.training_job import reference

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

STEPS = 5

# training_job.py's ranks, saying where each ran and which interface Gloo bound.
WORKER = """\
import os
import sys
from pathlib import Path

from tests.support.workers.training_job import distributed

distributed(Path(sys.argv[1]), int(sys.argv[2]), "none", "sgd")
print(
    f"ran host={os.environ['ELASTIC_HOSTNAME']} netns={os.readlink('/proc/self/ns/net')} "
    f"gloo={os.environ.get('GLOO_SOCKET_IFNAME')}",
    flush=True,
)
"""


def test_three_hosts_train_together(
    bed: Bed, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "worker.py", WORKER)
    hosts = ",".join(f"{host.address}:1" for host in bed.hosts)
    job = elasticrun(
        ["-np", "3", "-H", hosts, *bed.ssh_args(), "--start-timeout", "60",
         sys.executable, str(worker), str(tmp_path), str(STEPS)]
    )  # fmt: skip
    assert job.finish(timeout=100) == 0, job.transcript()

    places = {}
    for rank in range(3):
        assert f"[{rank}]<stdout>:trained rank={rank}" in job.stdout, job.transcript()
        ran = job.wait_for(rf"^\[{rank}\]<stdout>:ran host=(\S+) netns=(\S+) gloo=(\S+)$")
        places[rank] = ran.groups()
    assert {host for host, _, _ in places.values()} == {host.address for host in bed.hosts}
    namespaces = {netns for _, netns, _ in places.values()}
    assert len(namespaces) == 3 and os.readlink("/proc/self/ns/net") not in namespaces
    assert {gloo for _, _, gloo in places.values()} == {"eth0"}

    want = reference(STEPS, "sgd")
    for rank in range(3):
        got = torch.load(tmp_path / f"params.{rank}.pt")
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-5)
