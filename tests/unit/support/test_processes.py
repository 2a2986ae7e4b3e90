"""The test fixtures' process finder: what it reaps after a job must be exactly the processes
that work in the test's folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import processes_working_in


def test_a_process_working_in_the_folder_is_found_and_one_elsewhere_is_not(tmp_path: Path) -> None:
    inside = tmp_path / "job" / "deeper"
    inside.mkdir(parents=True)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-sibling"  # shares the name's prefix
    elsewhere.mkdir()
    near = subprocess.Popen(["sleep", "30"], cwd=inside)
    far = subprocess.Popen(["sleep", "30"], cwd=elsewhere)
    try:
        found = processes_working_in(str(tmp_path))
        assert near.pid in found
        assert far.pid not in found
    finally:
        for process in (near, far):
            process.kill()
            process.wait()
    assert near.pid not in processes_working_in(str(tmp_path))  # a reaped process is gone
