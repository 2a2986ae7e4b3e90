"""The fault soak on the multi-host bed (tests/multihost/soak.py): the job on three bed hosts
reached through ssh, its state in a real etcd, under a seeded stream of overlapping faults:
the process faults of `tests/e2e/elastic/test_soak.py` and the bed's (hosts that vanish and return,
partitions from the driver and from the peers, link flaps, slow lossy links). The same
checks: exit 0, every sample trained exactly once per epoch, the epoch never goes back
without a reason, no process left (in any namespace), every worker line relayed; and the
per-fault-kind table of the time to the next step.

`test_bed_fault_soak` is the bounded run (every CI run: each kind once, a few more);
`test_bed_fault_soak_full` the long one (110 faults, marked slow: ELASTIC_SLOW_TESTS=1).
ELASTIC_SOAK_SEED and ELASTIC_SOAK_FAULTS work as for the local soak.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.elastic.test_soak import run_soak, soak_config
from tests.multihost.bed import Bed
from tests.multihost.soak import BED_WEIGHTS, BedSoak
from tests.support.etcd_server import EtcdServer

pytestmark = pytest.mark.multihost


def bed_soak(bed: Bed, etcd: EtcdServer, folder: Path, faults: int) -> BedSoak:
    config = soak_config(
        faults,
        hosts=tuple(host.address for host in bed.hosts),
        slots=1,
        weights=dict(BED_WEIGHTS),
        launcher_args=tuple(bed.ssh_args()),
    )
    return BedSoak(config, folder, etcd, bed=bed)


@pytest.mark.timeout(480)
def test_bed_fault_soak(
    bed: Bed, etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_soak(bed_soak(bed, etcd, tmp_path, len(BED_WEIGHTS) + 3), capsys)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_bed_fault_soak_full(
    bed: Bed, etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_soak(bed_soak(bed, etcd, tmp_path, 110), capsys)
