"""The `bed` fixture: a fresh 3-host bed (tests/multihost/bed.py) for each test, closed after
it whatever happened; skipped, with one line saying why, where this machine cannot hold one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.multihost.bed import Bed, BedUnavailable, missing_prerequisite
from tests.multihost.bed_job import BedJob
from tests.support.running_job import RunningJob


def build_bed(count: int, directory: Path) -> Bed:
    """A bed of `count` hosts keeping its keys and logs in `directory`; skips the test where
    the machine cannot hold one."""
    if reason := missing_prerequisite():
        pytest.skip(reason)
    try:
        return Bed(count, directory)
    except BedUnavailable as err:
        pytest.skip(str(err))


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    """Three hosts h1, h2, h3, each reached through its own sshd (`bed.ssh_args()`)."""
    built = build_bed(3, tmp_path / "bed")
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def bed_job(
    bed: Bed, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> Iterator[Callable[..., BedJob]]:
    def start(*extra: str) -> BedJob:
        return BedJob(bed, elasticrun, tmp_path, *extra)

    yield start
