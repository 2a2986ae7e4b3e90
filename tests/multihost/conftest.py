"""The `bed` fixture: a fresh 3-host bed (tests/multihost/bed.py) for each test, closed after
it whatever happened; skipped, with one line saying why, where this machine cannot hold one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.bed import Bed, BedUnavailable, missing_prerequisite


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
