"""The driver's open-file budget: each port's share, the reserve, and raising the limit."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from elastic.driver.descriptors import (
    BEAT_CONNECTIONS,
    GRPC_CONNECTIONS,
    HTTP_CONNECTIONS,
    MIN_RESERVE,
    WANTED_OPEN_FILES,
    descriptor_budget,
)
from tests.support.paths import REPOSITORY as ROOT


@pytest.mark.parametrize("limit", [300, 1_024, 4_096, 20_000, 65_536, 1_048_576])
def test_the_ports_together_never_take_the_reserve(limit: int) -> None:
    budget = descriptor_budget(limit)
    assert budget.reserve >= max(MIN_RESERVE, limit // 8)
    assert budget.http + budget.grpc + budget.beats <= limit - budget.reserve
    assert budget.http <= HTTP_CONNECTIONS
    assert budget.grpc <= GRPC_CONNECTIONS and budget.beats <= BEAT_CONNECTIONS
    assert min(budget.http, budget.grpc, budget.beats) >= 1


def test_the_limit_the_driver_asks_for_gives_every_port_its_largest_share() -> None:
    budget = descriptor_budget(WANTED_OPEN_FILES)
    assert (budget.http, budget.grpc, budget.beats) == (
        HTTP_CONNECTIONS,
        GRPC_CONNECTIONS,
        BEAT_CONNECTIONS,
    )
    assert descriptor_budget(20_000).beats >= 5_000  # 5,000 workers on this machine's limit


RAISE = """
import resource
from elastic.driver.descriptors import raise_open_file_limit
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_the_driver_raises_its_soft_limit_toward_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    done = subprocess.run(
        [sys.executable, "-c", RAISE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    expected = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, WANTED_OPEN_FILES)
    assert done.stdout.split() == [str(expected), str(expected)]
    assert done.stderr == "", "nothing is logged when it can"
