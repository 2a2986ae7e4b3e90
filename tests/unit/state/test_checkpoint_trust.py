"""Checkpoints cannot carry code: what a checkpoint directory holds is loaded as data only.

Real files in temporary directories (and fsspec's in-memory filesystem for the non-local
path), real `torch.load`, real Gloo groups for the states that commit, and a real
`elasticrun` job that finds a planted pickle in its checkpoint directory.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import io
import json
import logging
import os
import pickle
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from torch import nn

from elastic.protocol.env import CheckpointSettings, WorkerEnvironmentError
from elastic.state import ElasticSampler, ObjectState, TorchState
from elastic.state.durable import CheckpointDir, CheckpointRefused
from elastic.state.loadable import UnloadableCommit
from elastic.state.private_dir import UntrustedDirectory
from tests.support.paths import WORKERS
from tests.support.worker_group import run_group

ELASTIC_JOB = WORKERS / "elastic_job.py"


class Planted:
    """A pickle that, when loaded as a full pickle, writes `marker`: what an attacker plants."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _torch_file(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def plant(url: str, commit: int, data: bytes, payload_name: str | None = None) -> None:
    """Put commit `commit` into the directory at `url` as a writer other than the job would:
    the payload `data` and a manifest that matches it (size and SHA-256), naming
    `payload_name` (default: the payload's own name)."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    name = f"commit-{commit:012d}"
    if payload_name is None:
        payload_name = f"{name}.pt"
        fs.pipe(f"{root}/{payload_name}", data)
    manifest = {
        "format": 1,
        "commit": commit,
        "payload": payload_name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "written_at": 0.0,
    }
    fs.pipe(f"{root}/{name}.json", json.dumps(manifest).encode())


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "ckpt")
        return
    where = f"durable-trust-{tmp_path.name}"
    yield f"memory://{where}"
    memory = fsspec.filesystem("memory")
    if memory.exists(where):
        memory.rm(where, recursive=True)


def _good(value: str) -> dict[str, Any]:
    return {"objects": {"value": value}, "handlers": {}}


def _not_used_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]


# --- what a checkpoint holds ---------------------------------------------------------------


def test_a_planted_pickle_never_runs_and_the_checkpoint_before_it_is_loaded(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "planted-code-ran"
    directory = CheckpointDir(url)
    directory.write(1, _good("good"))
    plant(url, 2, _torch_file({"objects": Planted(marker)}))  # a torch file
    plant(url, 3, pickle.dumps(Planted(marker), protocol=2))  # a bare pickle
    with caplog.at_level(logging.WARNING, logger="elastic"):
        newest = directory.newest()
    assert not marker.exists(), "the planted pickle ran"
    assert newest is not None and newest.payload == _good("good")
    lines = _not_used_lines(caplog)
    assert len(lines) == 2, lines
    assert "commit-000000000003.pt is not a torch file" in lines[0]
    assert "commit-000000000002.pt holds what torch.load(weights_only=True) refuses" in lines[1]
    assert "--checkpoint-trust-pickles" in lines[1] and "\n" not in lines[1]
    with pytest.raises(CheckpointRefused, match="exec"):
        directory.load(2)


def test_a_manifest_naming_a_file_outside_its_directory_is_refused(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = CheckpointDir(url)
    directory.write(1, _good("good"))
    outside = _torch_file(_good("outside"))
    fs, root = fsspec.core.url_to_fs(url)
    parent = root.rstrip("/").rsplit("/", 1)[0]
    fs.pipe(f"{parent}/outside.pt", outside)
    plant(url, 2, outside, payload_name="../outside.pt")
    plant(url, 3, outside, payload_name=f"{parent}/outside.pt")
    plant(url, 4, outside, payload_name="commit-000000000001.pt")  # not its own
    with caplog.at_level(logging.WARNING, logger="elastic"):
        newest = directory.newest()
    assert newest is not None and newest.commit == 1 and newest.payload == _good("good")
    lines = _not_used_lines(caplog)
    assert len(lines) == 3, lines
    assert "'../outside.pt'" in lines[2] and "names only its own payload" in lines[2]


def test_a_link_or_a_file_another_user_may_write_in_a_local_directory_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = CheckpointDir(str(tmp_path / "ckpt"))
    directory.write(1, _good("good"))
    outside = tmp_path / "outside.pt"
    outside.write_bytes(_torch_file(_good("outside")))
    plant(directory.url, 2, outside.read_bytes())
    (tmp_path / "ckpt" / "commit-000000000002.pt").unlink()
    (tmp_path / "ckpt" / "commit-000000000002.pt").symlink_to(outside)
    plant(directory.url, 3, outside.read_bytes())
    os.chmod(tmp_path / "ckpt" / "commit-000000000003.pt", 0o666)
    fifo = tmp_path / "ckpt" / "commit-000000000004.json"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    with caplog.at_level(logging.WARNING, logger="elastic"):
        newest = directory.newest()
    assert newest is not None and newest.commit == 1
    lines = _not_used_lines(caplog)
    assert len(lines) == 3, lines
    assert "not a regular file" in lines[0]
    assert "mode 0666" in lines[1] and "another user may have written it" in lines[1]
    assert "symbolic link" in lines[2]


def test_a_payload_that_is_not_a_torch_file_is_passed_over_and_nothing_raises(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = CheckpointDir(url)
    directory.write(1, _good("good"))
    plant(url, 2, os.urandom(4096))  # garbage, with a manifest that matches it
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe(f"{root}/commit-000000000003.json", b"[]")  # JSON, but no manifest
    fs.pipe(f"{root}/commit-000000000004.json", b"[" * 40_000)  # too deep to parse
    plant(url, 5, _torch_file([1, 2, 3]))  # loads, but is no state's payload
    with caplog.at_level(logging.WARNING, logger="elastic"):
        newest = directory.newest(ObjectState()._durable_misfit)
    assert newest is not None and newest.commit == 1
    lines = _not_used_lines(caplog)
    assert len(lines) == 4, lines
    assert "commit-000000000005.pt holds a list, not a state's payload" in lines[0]
    assert "commit-000000000002.pt is not a torch file" in lines[3]


def _resume(url: str) -> dict[str, Any]:
    state = ObjectState(value="fresh", checkpoint_dir=url)
    state.sync()
    return {"value": state.value, "count": state.commit_count}


@pytest.mark.e2e
def test_a_worker_that_finds_only_unusable_checkpoints_starts_from_scratch(
    tmp_path: Path,
) -> None:
    """The fault the issue found, in real workers: a planted pickle and a garbage payload are
    the only checkpoints; the workers live, nothing planted runs, training starts afresh."""
    url, marker = str(tmp_path / "ckpt"), tmp_path / "planted-code-ran"
    os.makedirs(url, mode=0o700)
    plant(url, 7, os.urandom(512))
    plant(url, 9, _torch_file({"objects": Planted(marker)}))
    outs = run_group(_resume, 2, url, timeout=60)
    assert outs == [{"value": "fresh", "count": 0}] * 2
    assert not marker.exists()


# --- the directory ---------------------------------------------------------------------------


def test_a_new_local_directory_is_made_0700_and_its_files_0600(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    CheckpointDir(str(path)).write(1, _good("good"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    files = sorted(path.iterdir())
    assert [f.name for f in files] == ["commit-000000000001.json", "commit-000000000001.pt"]
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


def test_a_directory_others_may_write_is_refused_saying_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ckpt"
    directory = CheckpointDir(str(path))
    directory.write(1, _good("good"))
    os.chmod(path, 0o777)
    for use in (directory.commits, lambda: directory.load(1), lambda: directory.write(2, {})):
        with pytest.raises(UntrustedDirectory) as refused:
            use()
        message = str(refused.value)
        assert str(path) in message and "mode 0777" in message, message
        assert f"uid {os.geteuid()}" in message and f"chmod go-w {path}" in message, message
    with caplog.at_level(logging.ERROR, logger="elastic"):
        assert directory.newest() is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert str(path) in line and "mode 0777" in line
    assert sorted(p.name for p in path.iterdir())[0] == "commit-000000000001.json"
    os.chmod(path, 0o755)  # readable by others, writable by its owner only: accepted
    assert directory.commits() == [1]


@pytest.mark.root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user (uid 65534) needs root")
    path = tmp_path / "ckpt"
    CheckpointDir(str(path)).write(1, _good("good"))
    os.chown(path, 65534, 65534)
    with pytest.raises(UntrustedDirectory) as refused:
        CheckpointDir(str(path)).load(1)
    message = str(refused.value)
    assert "owned by uid 65534 with mode 0700" in message and f"chown 0 {path}" in message
    with pytest.raises(UntrustedDirectory):
        CheckpointDir(str(path)).write(2, _good("again"))


@pytest.mark.e2e
def test_a_state_in_a_directory_others_may_write_trains_on_without_it(tmp_path: Path) -> None:
    """Refused directory, real workers: nothing is loaded from it, the workers live."""
    url, marker = str(tmp_path / "ckpt"), tmp_path / "planted-code-ran"
    plant(url, 3, _torch_file(_good("planted")))
    os.chmod(url, 0o777)
    outs = run_group(_resume, 2, url, timeout=60)
    assert outs == [{"value": "fresh", "count": 0}] * 2
    assert not marker.exists()


# --- what a commit may hold ------------------------------------------------------------------

PLAIN_VALUES: dict[str, Any] = {
    "none": None, "flag": True, "count": 7, "big": 2**80, "rate": 0.5, "z": 1 + 2j,
    "name": "résumé", "raw": b"\x00\xff", "buffer": bytearray(b"ab"),
    "losses": [0.9, 0.8], "pair": (1, "a"), "table": {"a": [1, {"b": (None,)}], 3: 4.0},
    "seen": {1, 2}, "ordered": collections.OrderedDict(b=1, a=2),
    "tally": collections.Counter("aab"),
    "shape": torch.Size([2, 3]), "dtype": torch.bfloat16, "device": torch.device("cpu"),
    "tensor": torch.arange(6).reshape(2, 3), "rng": torch.get_rng_state(),
}  # fmt: skip


def test_the_project_s_own_state_loads_back_with_weights_only(tmp_path: Path) -> None:
    """A TorchState (model, optimizer, LR scheduler, sampler) and every kind of plain value an
    ObjectState holds round-trip through a checkpoint loaded with weights_only=True."""
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    sampler = ElasticSampler(range(20), seed=3)
    sampler.record_batch(0, 4)
    state = TorchState(model, optimizer, scheduler=scheduler, sampler=sampler, **PLAIN_VALUES)
    directory = CheckpointDir(str(tmp_path / "ckpt"))
    directory.write(1, state._durable_payload())
    state._durable_written()
    loaded = directory.load(1).payload
    assert state._durable_misfit(loaded) is None
    for name, value in PLAIN_VALUES.items():
        got = loaded["objects"][name]
        assert type(got) is type(value), name
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
    fresh = TorchState(
        nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)),
        torch.optim.Adam(model.parameters(), lr=0.5),
        sampler=ElasticSampler(range(20), seed=3),
        **dict.fromkeys(PLAIN_VALUES),
    )
    fresh._load_durable(loaded)
    assert fresh.optimizer.state_dict()["param_groups"][0]["lr"] == 0.01
    assert fresh.sampler.processed_indices == sampler.processed_indices
    for name, param in model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[name], param), name


class Custom:
    """A user's own class: no checkpoint can hold it unless full pickles are trusted."""

    def __init__(self, value: int) -> None:
        self.value = value


def _commit_a_value_no_checkpoint_holds(url: str, trust: bool) -> dict[str, Any]:
    os.environ["ELASTIC_CHECKPOINT_TRUST_PICKLES"] = "1" if trust else "0"
    state = ObjectState(checkpoint_dir=url, step=0, when=None)
    state.commit()  # plain values: written
    assert state.durable is not None and state.durable.wait(10)
    state.when = {"started": datetime.datetime(2026, 1, 2), "by": [Custom(3)]}
    state.step = 1
    try:
        state.commit()
    except UnloadableCommit as err:
        return {"error": str(err)}
    state.durable.wait(10)
    return {"written": state.durable.written}


@pytest.mark.e2e
def test_a_commit_holding_what_a_checkpoint_cannot_hold_fails_on_every_rank_at_once(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "ckpt")
    outs = run_group(_commit_a_value_no_checkpoint_holds, 2, url, False, timeout=60)
    assert all("error" in out for out in outs), outs
    rank0, rank1 = outs[0]["error"], outs[1]["error"]
    assert "durable commit 2 not written" in rank0 and "\n" not in rank0
    assert "state.when['started'] is a datetime.datetime" in rank0, rank0
    assert "--checkpoint-trust-pickles" in rank0 and "add_safe_globals" in rank0
    assert "durable commit 2 not written" in rank1 and "rank 0" in rank1
    assert CheckpointDir(url).commits() == [1], "nothing unloadable was written"


@pytest.mark.e2e
def test_trusting_pickles_lets_a_commit_hold_any_object_and_loads_it_back(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "ckpt")
    outs = run_group(_commit_a_value_no_checkpoint_holds, 2, url, True, timeout=60)
    assert outs[0] == {"written": 2}
    with pytest.raises(CheckpointRefused, match="--checkpoint-trust-pickles"):
        CheckpointDir(url).load(2)  # not trusted: refused, as any pickle
    loaded = CheckpointDir(url, trust_pickles=True).load(2).payload["objects"]["when"]
    assert loaded["started"] == datetime.datetime(2026, 1, 2) and loaded["by"][0].value == 3


def test_the_trust_flag_reaches_the_workers_and_a_bad_value_is_named(tmp_path: Path) -> None:
    from elastic.driver.cli.main import parse_settings

    args = ["-np", "1", "--checkpoint-dir", str(tmp_path), "--checkpoint-trust-pickles", "x"]
    settings = parse_settings(args).checkpoint
    assert settings.trust_pickles
    assert settings.to_env()["ELASTIC_CHECKPOINT_TRUST_PICKLES"] == "1"
    assert CheckpointSettings.from_env(settings.to_env()) == settings
    plain = parse_settings(["-np", "1", "--checkpoint-dir", str(tmp_path), "x"]).checkpoint
    assert not CheckpointSettings.from_env(plain.to_env()).trust_pickles
    with pytest.raises(WorkerEnvironmentError, match="ELASTIC_CHECKPOINT_TRUST_PICKLES"):
        CheckpointSettings.from_env(
            {"ELASTIC_CHECKPOINT_DIR": "/x", "ELASTIC_CHECKPOINT_TRUST_PICKLES": "yes"}
        )


# --- a real job --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_job_whose_directory_holds_a_planted_pickle_resumes_from_the_good_one_before_it(
    elasticrun, tmp_path: Path
) -> None:
    """A finished job's checkpoints, then a newer commit planted by someone else: the next
    job says in one line that it is not used, runs none of it, and resumes from the newest
    good commit, training every sample once per epoch."""
    ckpt, out, marker = tmp_path / "ckpt", tmp_path / "out", tmp_path / "planted-code-ran"
    out.mkdir()
    args = [
        "-np", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-keep", "3",
        sys.executable, str(ELASTIC_JOB), "--out", str(out), "--samples", "48",
        "--commit-every", "2", "--step-delay", "0",
    ]  # fmt: skip
    assert elasticrun([*args, "--epochs", "1"]).finish(120) == 0
    good = CheckpointDir(str(ckpt)).commits()[0]
    plant(str(ckpt), good + 5, _torch_file({"objects": Planted(marker), "handlers": {}}))
    second = elasticrun([*args, "--epochs", "2"])
    refused = second.wait_for(r"checkpoint .*: not used, commit-(\d+)\.pt holds what .*", 90)
    assert int(refused.group(1)) == good + 5 and "--checkpoint-trust-pickles" in refused.group(0)
    resumed = int(second.wait_for(r"resuming from durable commit (\d+)").group(1))
    assert resumed == good
    assert second.finish(120) == 0, second.transcript()
    assert not marker.exists(), "the planted pickle ran in a worker"
    result = json.loads((out / "result.json").read_text())
    assert set(result["counts"]) == {2.0}, "every sample trained on once per epoch"
