"""`python -m elastic.worker.standby` started by hand or with what it cannot use: one line
and exit 1, never a traceback; and a `--preload` module that must be imported in the main
thread (it sets a signal handler) is imported there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from elastic.protocol.env import STANDBY_COMMAND, STANDBY_ID, STANDBY_PRELOAD


def standby(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_")}
    return subprocess.run(
        [sys.executable, "-m", "elastic.worker.standby"], env={**keep, **env}, cwd=cwd,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_standby_started_by_hand_says_so_in_one_line(tmp_path: Path) -> None:
    done = standby({}, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "elastic.worker.standby: not started by elasticrun as a standby (ELASTIC_STANDBY_ID "
        "or ELASTIC_STANDBY_COMMAND missing or unusable)"
    ]


def test_preloading_runs_in_the_main_thread_where_it_must_and_a_failure_is_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "needs_main.py").write_text(
        "import signal\nsignal.signal(signal.SIGUSR2, lambda *a: None)\nprint('imported')\n"
    )
    command = json.dumps(["python", str(tmp_path / "train.py")])
    base = {STANDBY_ID: "h#standby.1", STANDBY_COMMAND: command}
    done = standby({**base, STANDBY_PRELOAD: "needs_main"}, tmp_path)
    assert done.stdout == "imported\n", "found beside the script, imported in the main thread"
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert "not started by elasticrun" in done.stderr  # no driver to wait at
    missing = standby({**base, STANDBY_PRELOAD: "needs_main,no_such_module_here"}, tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        "elastic.worker.standby: preloading failed: ModuleNotFoundError: No module named "
        "'no_such_module_here'"
    ]
