"""`elastic.run_job`: real `elasticrun` jobs launched from Python, their values back by rank."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elastic
from elastic.driver.errors import UsageError
from elastic.function_job import launcher_flags
from tests.support.processes import pids_alive

CALLER = """
import sys, elastic
from tests.e2e.launcher.test_run_job import wait_forever
try:
    elastic.run_job(wait_forever, args=(sys.argv[1],), np=2)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def rank_sum(offset: float) -> tuple[int, int, float]:
    """Each rank's (rank, size, sum over ranks of rank + offset), the sum by an allreduce."""
    import torch

    import elastic.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() + offset]), op=hvd.Sum).item()
    return hvd.rank(), hvd.size(), total


def fail_on_rank_one() -> int:
    rank = int(os.environ["ELASTIC_RANK"])
    if rank == 1:
        raise KeyError("rank one's own failure")
    return rank


def exit_3_on_rank_one() -> int:
    """Rank 1 ends its process with code 3, leaving no traceback; rank 0 waits to be stopped."""
    if int(os.environ["ELASTIC_RANK"]) == 1:
        os._exit(3)
    time.sleep(120)
    return 0


def lose_a_worker_once(marker: str) -> tuple[int, int, int]:
    """Train 20 committed steps; rank 1 of the first 2-worker round dies once (the first to
    create `marker`), and the job goes on with the survivor. Returns (rank, size, steps)."""
    import torch

    import elastic.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(steps=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> tuple[int, int, int]:
        while state.steps < 20:
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
            if hvd.size() == 2 and hvd.rank() == 1:
                try:
                    with open(marker, "x"):
                        pass
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            state.steps += 1
            state.commit()
        return hvd.rank(), hvd.size(), state.steps

    return train(state)


def wait_forever(folder: str) -> None:
    """Leave this worker's pid in `folder` (as `pid.<pid>`), then wait to be stopped."""
    with open(os.path.join(folder, f"pid.{os.getpid()}"), "w"):
        pass
    while True:
        time.sleep(1)


def test_each_rank_returns_its_value_computed_with_a_collective() -> None:
    values = elastic.run_job(rank_sum, args=(10.0,), np=2, start_timeout=60)
    assert values == [(0, 2, 21.0), (1, 2, 21.0)]


def test_a_lambda_with_keyword_arguments_travels_by_value() -> None:
    values = elastic.run_job(
        lambda a, b=0: a * b, args=(3,), kwargs={"b": 5}, np=2, hosts=["localhost:2"]
    )
    assert values == [15, 15]


def test_a_failing_rank_raises_in_the_caller_with_its_traceback() -> None:
    with pytest.raises(elastic.JobFailedError) as raised:
        elastic.run_job(fail_on_rank_one, np=2)
    assert list(raised.value.tracebacks) == [1]
    assert 'KeyError: "rank one\'s own failure"' in raised.value.tracebacks[1]
    assert "rank 1 raised" in str(raised.value) and "fail_on_rank_one" in str(raised.value)
    assert raised.value.exit_code == 1


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_job_failing_without_a_traceback_is_told_by_the_launchers_last_line(
    log_format: str,
) -> None:
    with pytest.raises(elastic.JobFailedError) as raised:
        elastic.run_job(exit_3_on_rank_one, np=2, log_format=log_format)
    assert raised.value.exit_code == 3
    said = str(raised.value)
    assert re.fullmatch(r"the job failed with exit code 3: elasticrun: job \S+ ended with exit "
                        r"code 3 after .*", said), said  # fmt: skip


def test_flags_the_launcher_refuses_raise_a_usage_error_with_its_message() -> None:
    with pytest.raises(UsageError, match="unrecognized arguments: --no-such-flag"):
        elastic.run_job(rank_sum, args=(0.0,), np=2, no_such_flag=1)
    with pytest.raises(UsageError, match="--max-np 1 is less than --min-np 2"):
        elastic.run_job(rank_sum, args=(0.0,), np=2, min_np=2, max_np=1)


def test_an_elastic_job_returns_the_values_of_the_last_rounds_ranks(tmp_path: Path) -> None:
    values = elastic.run_job(
        lose_a_worker_once,
        args=(str(tmp_path / "died"),),
        np=2,
        min_np=1,
        max_np=2,
        blacklist_cooldown_range=(300, 300),  # the lost slot is not filled again
        failure_scope="worker",  # its host-mate goes on
    )
    assert (tmp_path / "died").exists()
    assert values == [(0, 1, 20)]


def test_keywords_become_launcher_flags() -> None:
    flags = {"min_np": 2, "tls": True, "verbose": False, "job_id": None}
    assert launcher_flags(flags) == ["--min-np=2", "--tls"]
    assert launcher_flags({"blacklist_cooldown_range": (0, 5)}) == [
        "--blacklist-cooldown-range",
        "0",
        "5",
    ]


def test_interrupting_the_caller_stops_the_launcher_and_every_worker(tmp_path: Path) -> None:
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("pid.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = [int(path.suffix[1:]) for path in tmp_path.glob("pid.*")]
        assert len(pids_alive(workers)) == 2
        caller.send_signal(signal.SIGINT)
        out, _ = caller.communicate(timeout=60)
    finally:
        caller.kill()
    assert out.splitlines()[-1] == "interrupted"
    assert pids_alive(workers) == []
