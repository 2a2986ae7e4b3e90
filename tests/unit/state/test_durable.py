"""Durable commits: checkpoints written, verified, pruned and resumed from.

Real files (a temporary local directory, and fsspec's in-memory filesystem for the non-local
path), real Gloo groups for the states that write and resume.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from torch import nn

from elastic.protocol.env import CheckpointSettings, WorkerEnvironmentError
from elastic.state import ElasticSampler, ObjectState, TorchState
from elastic.state.durable import CheckpointCorrupt, CheckpointDir, DurableWriter, durable_writer
from elastic.worker import context
from tests.support.paths import WORKERS
from tests.support.processes import pids_alive
from tests.support.worker_group import run_group


def _payload(value: float) -> dict[str, Any]:
    return {"weights": torch.full((4,), value), "step": int(value)}


@pytest.fixture(params=["local", "memory"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointDir]:
    if request.param == "local":
        yield CheckpointDir(str(tmp_path / "ckpt"))
        return
    url = f"memory://durable-{tmp_path.name}"
    yield CheckpointDir(url)
    memory = fsspec.filesystem("memory")
    if memory.exists(url.removeprefix("memory://")):
        memory.rm(url.removeprefix("memory://"), recursive=True)


def test_a_written_commit_loads_back_and_the_newest_comes_first(directory: CheckpointDir) -> None:
    assert directory.commits() == [] and directory.newest() is None  # no directory yet
    for commit in (3, 7, 5):
        directory.write(commit, _payload(commit))
    assert directory.commits() == [7, 5, 3]
    newest = directory.newest()
    assert newest is not None and newest.commit == 7
    assert newest.payload["step"] == 7 and torch.equal(
        newest.payload["weights"], torch.full((4,), 7.0)
    )


def test_prune_keeps_the_newest_and_drops_older_leftovers(directory: CheckpointDir) -> None:
    for commit in (1, 2, 3, 4):
        directory.write(commit, _payload(commit))
    fs, root = fsspec.core.url_to_fs(directory.url)
    fs.pipe(f"{root}/.commit-000000000002.pt.dead.tmp", b"half a write")  # a writer that died
    fs.pipe(f"{root}/.commit-000000000009.pt.live.tmp", b"a write in flight")
    directory.prune(keep=2)
    assert directory.commits() == [4, 3]
    left = sorted(str(name).rsplit("/", 1)[-1] for name in fs.ls(root, detail=False))
    assert ".commit-000000000002.pt.dead.tmp" not in left
    assert ".commit-000000000009.pt.live.tmp" in left  # newer than what is kept: not touched
    assert "commit-000000000001.pt" not in left and "commit-000000000003.pt" in left


def test_a_corrupt_or_unfinished_checkpoint_is_never_loaded_the_one_before_is(
    directory: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    for commit in (1, 2, 3):
        directory.write(commit, _payload(commit))
    fs, root = fsspec.core.url_to_fs(directory.url)
    payload = f"{root}/commit-000000000003.pt"
    data = fs.cat(payload)
    fs.pipe(payload, data[: len(data) // 2])  # cut short: a torn copy
    with pytest.raises(CheckpointCorrupt, match="bytes"):
        directory.load(3)
    fs.pipe(f"{root}/commit-000000000002.pt", bytes(reversed(data)))  # same size, other bytes
    with pytest.raises(CheckpointCorrupt):
        directory.load(2)
    fs.pipe(f"{root}/commit-000000000004.pt", data)  # a payload whose manifest never came
    with caplog.at_level(logging.WARNING, logger="elastic"):
        newest = directory.newest()
    assert newest is not None and newest.commit == 1
    assert directory.commits() == [3, 2, 1]
    assert sum("not used" in r.message for r in caplog.records) == 2


class _Gate:
    """A checkpoint directory whose writes wait for `open` (a slow disk), then fail or not."""

    def __init__(self, inner: CheckpointDir, fail: bool = False) -> None:
        self.inner, self.url, self.fail = inner, inner.url, fail
        self.open = threading.Event()
        self.written: list[int] = []

    def write(self, commit: int, payload: Any) -> int:
        self.open.wait(10)
        if self.fail:
            raise OSError(28, "No space left on device")
        self.written.append(commit)
        return self.inner.write(commit, payload)

    def prune(self, keep: int) -> None:
        self.inner.prune(keep)


def test_the_writer_writes_when_due_and_never_two_at_once(tmp_path: Path) -> None:
    gate = _Gate(CheckpointDir(str(tmp_path)))
    now = [0.0]
    writer = DurableWriter(gate, every_commits=3, every_seconds=10.0, keep=2, clock=lambda: now[0])  # type: ignore[arg-type]
    assert writer.offer(1, _payload(1))
    assert not writer.offer(4, _payload(4)), "a write is in flight"
    gate.open.set()
    assert writer.wait(10) and writer.written == 1
    assert not writer.offer(2, _payload(2)) and not writer.offer(3, _payload(3))
    assert writer.offer(4, _payload(4)) and writer.wait(10)  # 3 commits since the last
    now[0] = 11.0
    assert writer.offer(5, _payload(5)) and writer.wait(10)  # 10 s since the last
    assert gate.written == [1, 4, 5] and CheckpointDir(str(tmp_path)).commits() == [5, 4]
    assert writer.started == 3


def test_a_failing_write_is_said_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = _Gate(CheckpointDir(str(tmp_path)), fail=True)
    gate.open.set()
    writer = DurableWriter(gate, every_commits=1)  # type: ignore[arg-type]
    released = []
    with caplog.at_level(logging.ERROR, logger="elastic"):
        for commit in (1, 2, 3):
            assert writer.offer(commit, _payload(commit), lambda: released.append(True))
            assert writer.wait(10)
    assert writer.stale and writer.written == 0 and len(released) == 3
    errors = [r.message for r in caplog.records if "durable commit" in r.message]
    assert len(errors) == 1 and "No space left on device" in errors[0]
    assert "training goes on" in errors[0] and "stale" in errors[0]
    gate.fail = False
    assert writer.offer(4, _payload(4)) and writer.wait(10)
    assert not writer.stale and writer.written == 4


EXITS_MID_WRITE = """
import collections, logging, sys, time
from elastic.state.durable import CheckpointDir, DurableWriter

class Slow:  # pickled by the write: takes a second, as a large state would
    def __reduce__(self):  # ...into a value torch.load(weights_only=True) gives back
        time.sleep(1.0)
        return (collections.OrderedDict, ([("written", True)],))

logging.basicConfig(level=logging.INFO)
writer = DurableWriter(CheckpointDir(sys.argv[1]), exit_wait=float(sys.argv[2]))
assert writer.offer(1, {"state": Slow()})
print("exiting", flush=True)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("exit_wait", [30.0, 0.1])
def test_a_process_that_exits_lets_the_write_in_flight_finish_within_a_bound(
    tmp_path: Path, exit_wait: float
) -> None:
    directory = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-c", EXITS_MID_WRITE, str(directory), str(exit_wait)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "waiting up to" in done.stderr and "durable commit 1" in done.stderr
    if exit_wait > 1:
        assert CheckpointDir(str(directory)).load(1).payload == {"state": {"written": True}}
    else:  # gave up: said so, and nothing half-written is ever loaded
        assert "was not written within 0.1 s" in done.stderr
        assert CheckpointDir(str(directory)).newest() is None


def test_a_directory_that_cannot_be_made_is_one_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    writer = DurableWriter(CheckpointDir(str(blocker / "ckpt")))
    with caplog.at_level(logging.ERROR, logger="elastic"):
        assert writer.offer(1, _payload(1)) and writer.wait(10)
    assert writer.stale
    (line,) = [r.message for r in caplog.records if "durable commit" in r.message]
    assert str(blocker / "ckpt") in line


def test_settings_come_from_the_environment_and_bad_ones_are_named(monkeypatch) -> None:
    settings = CheckpointSettings("/shared/ckpt", every=5, interval=30.0, keep=3)
    assert CheckpointSettings.from_env(settings.to_env()) == settings
    assert CheckpointSettings().to_env() == {}
    with pytest.raises(WorkerEnvironmentError, match="ELASTIC_CHECKPOINT_EVERY"):
        CheckpointSettings.from_env(
            {"ELASTIC_CHECKPOINT_DIR": "/x", "ELASTIC_CHECKPOINT_EVERY": "often"}
        )
    with pytest.raises(WorkerEnvironmentError, match="at least 1"):
        CheckpointSettings.from_env(
            {"ELASTIC_CHECKPOINT_DIR": "/x", "ELASTIC_CHECKPOINT_KEEP": "0"}
        )
    monkeypatch.setenv("ELASTIC_CHECKPOINT_DIR", "/from/the/launcher")
    monkeypatch.setenv("ELASTIC_CHECKPOINT_EVERY", "4")
    writer = durable_writer()
    assert writer is not None and writer.directory.url == "/from/the/launcher"
    assert durable_writer("memory://own").directory.url == "memory://own"  # type: ignore[union-attr]
    monkeypatch.delenv("ELASTIC_CHECKPOINT_DIR")
    assert durable_writer() is None


# --- states that write, and states that resume, in real Gloo groups -----------------------


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))


def _digest(state: TorchState) -> dict[str, Any]:
    return {
        "model": {k: v.tolist() for k, v in state.model.state_dict().items()},
        "lr": state.optimizer.param_groups[0]["lr"],
        "moments": len(state.optimizer.state),
        "processed": sorted(state.sampler.processed_indices),
        "epoch": state.epoch,
        "count": state.commit_count,
    }


def _train_and_write(directory: str) -> dict[str, Any]:
    rank = context.current().rank
    model = _net(seed=rank)  # different on each rank until the first sync
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = TorchState(
        model=model,
        optimizer=optimizer,
        sampler=ElasticSampler(range(40), seed=1),
        epoch=0,
        checkpoint_dir=directory,
    )
    state.sync()
    for step in range(6):
        optimizer.zero_grad()
        model(torch.randn(5, 4, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
        state.sampler.record_batch(step, 2)
        state.epoch = step
        state.commit()
        assert state.durable is not None
        state.durable.wait(10)
    return _digest(state)


def _start_fresh(directory: str) -> dict[str, Any]:
    rank = context.current().rank
    model = _net(seed=100 + rank)
    state = TorchState(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.5),
        sampler=ElasticSampler(range(40), seed=1),
        epoch=-1,
        checkpoint_dir=directory,
    )
    state.sync()
    return _digest(state)


@pytest.mark.e2e
def test_a_job_that_lost_every_worker_resumes_from_the_newest_durable_commit(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "ckpt")
    before = run_group(_train_and_write, 2, directory, timeout=60)
    assert before[0] == before[1] and before[0]["count"] == 6
    assert CheckpointDir(directory).commits() == [6, 5]  # every commit written, 2 kept
    after = run_group(_start_fresh, 3, directory, timeout=60)  # a new fleet, of another size
    for digest in after:
        assert digest == before[0]


def _resume_with_one_live_rank(directory: str) -> dict[str, Any]:
    rank = context.current().rank
    state = ObjectState(value=f"fresh {rank}", checkpoint_dir=directory)
    spare = ObjectState()  # commits on it keep the collectives in step with rank 1's
    for _ in range(9):  # rank 1 is a live worker that reaches commit 9, newer than durable 4
        if rank == 1:
            state.value = "live"
        (state if rank == 1 else spare).commit()
    state.sync()
    return {"value": state.value, "count": state.commit_count}


@pytest.mark.e2e
def test_a_live_worker_with_a_newer_commit_wins_over_the_durable_one(tmp_path: Path) -> None:
    directory = CheckpointDir(str(tmp_path))
    directory.write(4, {"objects": {"value": "durable"}})
    outs = run_group(_resume_with_one_live_rank, 2, str(tmp_path), timeout=60)
    assert outs == [{"value": "live", "count": 9}] * 2


def test_a_durable_write_never_sees_the_next_commit_s_values(tmp_path: Path) -> None:
    """The snapshot a slow write holds is not refilled by the next commit's save."""
    model = nn.Linear(3, 1)
    state = TorchState(model=model)
    payload = state._durable_payload()
    held = payload["handlers"]["model"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.save()  # the next commit, while the write holds the last
    assert torch.equal(payload["handlers"]["model"]["weight"], held)
    state._durable_written()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.save()
    state.save()  # the released snapshot is filled again, not the one just taken only
    assert torch.equal(state._handlers["model"].saved["weight"], model.weight)


# --- the launcher's flag, end to end ----------------------------------------------------------

ELASTIC_JOB = WORKERS / "elastic_job.py"


@pytest.mark.timeout(180)
def test_a_job_killed_whole_and_started_again_resumes_where_its_durable_copy_was(
    elasticrun, tmp_path: Path
) -> None:
    """Driver and every worker SIGKILLed (a requeue, a fleet lost with its driver): the same
    command with the same --checkpoint-dir goes on from the newest durable commit, and every
    sample is still trained exactly once per epoch."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    args = [
        "-np", "2", "--min-np", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-keep", "3",
        sys.executable, str(ELASTIC_JOB), "--out", str(out), "--epochs", "2",
        "--commit-every", "3", "--step-delay", "0.05",
    ]  # fmt: skip
    first = elasticrun(args)
    first.wait_for(r"step 24 epoch")
    workers = [int(pid) for pid in re.findall(r"worker pid=(\d+)", first.output)]
    assert len(workers) == 2
    for pid in workers:  # every worker and the driver SIGKILLed: nothing says goodbye
        os.kill(pid, signal.SIGKILL)
    first.stop()
    deadline = time.monotonic() + 10
    while pids_alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids_alive(workers)
    commits = CheckpointDir(str(ckpt)).commits()
    assert commits and len(commits) <= 3, commits
    second = elasticrun(args)
    resumed = int(second.wait_for(r"resuming from durable commit (\d+)").group(1))
    assert resumed == commits[0]
    first_step = int(second.wait_for(r"step (\d+) epoch").group(1))
    assert first_step > 1, "the step counter went on from the durable commit"
    assert second.finish() == 0, second.transcript()
    result = json.loads((out / "result.json").read_text())
    assert set(result["counts"]) == {2.0}, "every sample trained on once per epoch"


@pytest.mark.timeout(120)
def test_a_directory_that_cannot_be_written_is_reported_by_the_job_and_training_goes_on(
    elasticrun, tmp_path: Path
) -> None:
    """--checkpoint-dir under a regular file: the writing worker logs why, the launcher says
    once that the durable copy is stale, `/v1/status` shows it, and the job ends well."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    status, out = tmp_path / "status.json", tmp_path / "out"
    out.mkdir()
    job = elasticrun(
        [
            "-np", "2", "--min-np", "1", "--checkpoint-dir", str(blocker / "ckpt"),
            "--heartbeat-interval", "0.2",
            sys.executable, str(ELASTIC_JOB), "--out", str(out), "--epochs", "2",
            "--commit-every", "2", "--step-delay", "0.05", "--status-file", str(status),
        ]
    )  # fmt: skip
    job.wait_for(r"elasticrun: the durable copy is stale: worker \S+ on \S+ failed", timeout=60)
    assert job.finish(90) == 0, job.transcript()
    said = job.output.count("elasticrun: the durable copy is stale")
    assert said == 1, "the launcher says it once, not at every failed write"
    assert re.search(r"durable commit \d+ to .*ckpt failed", job.output), "the worker says why"
    assert json.loads(status.read_text())["durable"] == {"newest": 0, "stale": True}
    result = json.loads((out / "result.json").read_text())
    assert set(result["counts"]) == {2.0}, "training went on: every sample, once per epoch"
