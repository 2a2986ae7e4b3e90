"""The durable checkpoints of sharded state on disk: which one is chosen, and what is refused.

Real DCP checkpoints written and read in this process (`no_dist`: one rank, no process
group), real files in temporary directories; a planted `.metadata` that would run code when
fully unpickled, links, other users' permissions, cut-short files and markers naming what
they should not.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from elastic.state.private_dir import UntrustedDirectory
from elastic.state.sharded.checkpoint_files import (
    CheckpointUnusable,
    Marker,
    ShardedCheckpointDir,
    choose_newest,
    newest_first,
)
from elastic.state.sharded.durable_checkpoint import Resumed, resume_line


class Planted:
    """What an attacker plants: a pickle that writes `marker` when it is fully unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def state(value: float) -> dict[str, Any]:
    return {"model": {"w": torch.full((3, 2), value)}, "optim": {"lr": 0.5}}


def write(directory: ShardedCheckpointDir, commit: int, value: float, round_: int = 1) -> Marker:
    """A finished checkpoint of one rank at `commit`, as the job writes it."""
    marker = Marker(commit, round_, 1, commit * 10, {}, "", [0])
    dcp.save(state(value), storage_writer=directory.writer(marker.name), no_dist=True)
    directory.finish(marker)
    return marker


def load(directory: ShardedCheckpointDir, marker: Marker) -> dict[str, Any]:
    into = state(0.0)
    dcp.load(
        into, storage_reader=directory.reader(marker), planner=directory.planner(), no_dist=True
    )
    return into


@pytest.fixture
def ckpt(tmp_path: Path) -> ShardedCheckpointDir:
    return ShardedCheckpointDir(str(tmp_path / "ckpt"))


def test_the_newest_finished_checkpoint_is_chosen_and_loads(ckpt: ShardedCheckpointDir) -> None:
    write(ckpt, 3, 3.0)
    write(ckpt, 5, 5.0)
    marker, passed = ckpt.newest()
    assert marker is not None and (marker.commit, marker.step, passed) == (5, 50, [])
    loaded = load(ckpt, marker)
    assert torch.equal(loaded["model"]["w"], torch.full((3, 2), 5.0))
    assert loaded["optim"]["lr"] == 0.5
    assert oct(os.stat(ckpt.url).st_mode & 0o777) == "0o700"


def test_a_checkpoint_without_its_marker_is_never_chosen(ckpt: ShardedCheckpointDir) -> None:
    write(ckpt, 3, 3.0)
    newer = Marker(7, 1, 1, None, {}, "", [0])  # written by every rank, the marker never
    dcp.save(state(7.0), storage_writer=ckpt.writer(newer.name), no_dist=True)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3 and passed == []


def test_order_is_by_commit_then_round() -> None:
    names = ["sharded-000000000002-r9.json", "sharded-000000000010-r1.json",
             "sharded-000000000010-r3.json", "sharded-000000000010-r3", "commit-000000000011.json",
             ".sharded-000000000012-r1.json.ab12.tmp"]  # fmt: skip
    assert [n for _, _, n in newest_first(names)] == [
        "sharded-000000000010-r3.json", "sharded-000000000010-r1.json",
        "sharded-000000000002-r9.json",
    ]  # fmt: skip

    def verify(name: str) -> Marker:
        if "-r3" in name:
            raise CheckpointUnusable(f"{name} is damaged")
        return Marker(10, 1, 1, None, {}, "", [0])

    marker, passed = choose_newest(names, verify)
    assert marker is not None and marker.round == 1
    assert passed == ["sharded-000000000010-r3.json is damaged"]


def _rewrite_marker(ckpt: ShardedCheckpointDir, marker: Marker, **changes: Any) -> None:
    path = ckpt.path(f"{marker.name}.json")
    raw = json.loads(Path(path).read_text())
    raw.update(changes)
    os.chmod(path, 0o600)
    Path(path).write_text(json.dumps(raw))


def test_a_planted_metadata_pickle_is_refused_and_never_run(
    ckpt: ShardedCheckpointDir, tmp_path: Path
) -> None:
    write(ckpt, 3, 3.0)
    newest = write(ckpt, 5, 5.0)
    ran = tmp_path / "ran"
    planted = pickle.dumps(Planted(ran))
    Path(ckpt.path(newest.name), ".metadata").write_bytes(planted)
    # the planter also fixes the marker's SHA-256 and size: the unpickler still refuses it
    files = json.loads(Path(ckpt.path(f"{newest.name}.json")).read_text())["files"]
    files[".metadata"] = len(planted)
    _rewrite_marker(ckpt, newest, metadata_sha256=hashlib.sha256(planted).hexdigest(), files=files)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3, "the one before it is used"
    assert len(passed) == 1 and "names builtins.exec, which DCP's index never holds" in passed[0]
    assert not ran.exists()


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"dir": "../elsewhere"}, "names the directory '../elsewhere'"),
        ({"files": {".metadata": 1, "../../etc/passwd": 1}}, "lists ['../../etc/passwd']"),
        ({"commit": 4}, "describes another checkpoint"),
        ({"metadata_sha256": "0" * 64}, ".metadata does not match its marker's SHA-256"),
    ],
)
def test_a_marker_names_only_its_own_checkpoint(
    ckpt: ShardedCheckpointDir, changes: dict[str, Any], why: str
) -> None:
    write(ckpt, 3, 3.0)
    _rewrite_marker(ckpt, write(ckpt, 5, 5.0), **changes)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3
    assert len(passed) == 1 and why in passed[0], passed


def test_a_cut_short_shard_file_is_passed_over(ckpt: ShardedCheckpointDir) -> None:
    write(ckpt, 3, 3.0)
    newest = write(ckpt, 5, 5.0)
    shard = Path(ckpt.path(newest.name), "__0_0.distcp")
    with shard.open("r+b") as file:
        file.truncate(shard.stat().st_size - 1)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3
    assert "does not hold the files its marker lists" in passed[0]


def test_links_and_files_others_may_write_are_refused(ckpt: ShardedCheckpointDir) -> None:
    write(ckpt, 3, 3.0)
    newest = write(ckpt, 5, 5.0)
    shard = Path(ckpt.path(newest.name), "__0_0.distcp")
    os.chmod(shard, 0o666)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3
    assert "another user may have written it" in passed[0]
    os.chmod(shard, 0o600)
    os.rename(shard, f"{shard}.real")
    os.symlink(f"{shard}.real", shard)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 3
    assert "__0_0.distcp" in passed[0] and "not a regular file" in passed[0]


def test_a_directory_others_may_write_is_refused_whole(ckpt: ShardedCheckpointDir) -> None:
    write(ckpt, 3, 3.0)
    os.chmod(ckpt.url, 0o777)
    with pytest.raises(UntrustedDirectory, match="chmod go-w"):
        ckpt.newest()


def test_keep_deletes_older_checkpoints_and_dead_writers_leftovers(
    ckpt: ShardedCheckpointDir,
) -> None:
    for commit in (1, 2, 3, 4):
        write(ckpt, commit, float(commit))
    dead = Marker(2, 2, 1, None, {}, "", [0])  # a writer of round 2 died before its marker
    dcp.save(state(2.0), storage_writer=ckpt.writer(dead.name), no_dist=True)
    in_flight = Marker(5, 2, 1, None, {}, "", [0])  # being written now
    dcp.save(state(5.0), storage_writer=ckpt.writer(in_flight.name), no_dist=True)
    ckpt.prune(2)
    assert sorted(os.listdir(ckpt.url)) == [
        "sharded-000000000003-r1", "sharded-000000000003-r1.json",
        "sharded-000000000004-r1", "sharded-000000000004-r1.json", "sharded-000000000005-r2",
    ]  # fmt: skip


def test_the_resume_line() -> None:
    resumed = Resumed(12, 3, 4, 120, [], "/ck")
    assert resume_line(resumed, 1, True, 135, 14) == (
        "more hosts lost than the 1 replica covers: resuming from the durable checkpoint of "
        "step 120 (commit 12) in /ck, 15 steps lost"
    )
    no_steps = Resumed(12, 3, 4, None, [], "/ck")
    assert resume_line(no_steps, 2, True, None, 14).endswith(
        "than the 2 replicas cover: resuming from the durable checkpoint of commit 12 in /ck, "
        "2 commits lost"
    )
    assert resume_line(resumed, 1, False, None, 0) == (
        "ShardedState: resuming from the durable checkpoint of step 120 (commit 12) in /ck"
    )


def test_an_object_planted_in_the_optimizer_state_is_refused_and_never_run(
    ckpt: ShardedCheckpointDir, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    marker = Marker(3, 1, 1, None, {}, "", [0])
    planted = {"model": {"w": torch.zeros(3, 2)}, "optim": {"lr": Planted(ran)}}
    dcp.save(planted, storage_writer=ckpt.writer(marker.name), no_dist=True)
    ckpt.finish(marker)
    chosen, _ = ckpt.newest()
    assert chosen is not None
    with pytest.raises(dcp.api.CheckpointException) as refused:
        load(ckpt, chosen)
    assert "Unsupported global: GLOBAL exec" in str(refused.value.failures[0])
    assert not ran.exists()


def test_an_fsspec_url_writes_and_loads_the_same_way() -> None:
    ckpt = ShardedCheckpointDir("memory://sharded-checkpoint-test")
    write(ckpt, 3, 3.0)
    write(ckpt, 5, 5.0)
    write(ckpt, 8, 8.0)
    ckpt.prune(2)
    marker, passed = ckpt.newest()
    assert marker is not None and marker.commit == 8 and passed == []
    assert torch.equal(load(ckpt, marker)["model"]["w"], torch.full((3, 2), 8.0))
    assert sorted(ckpt.names()) == [
        "sharded-000000000005-r1", "sharded-000000000005-r1.json",
        "sharded-000000000008-r1", "sharded-000000000008-r1.json",
    ]  # fmt: skip


def test_settings_come_from_the_launcher_unless_the_state_names_a_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from elastic.protocol.env import CheckpointSettings
    from elastic.state.sharded.durable_checkpoint import DurableCheckpoints

    for name in CheckpointSettings(directory="x").to_env():
        monkeypatch.delenv(name, raising=False)
    assert DurableCheckpoints.from_settings() is None, "nothing to pay without a directory"
    settings = CheckpointSettings(str(tmp_path / "a"), every=3, keep=4, trust_pickles=True)
    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    from_launcher = DurableCheckpoints.from_settings()
    assert from_launcher is not None and from_launcher.directory.url == str(tmp_path / "a")
    assert (from_launcher._every, from_launcher._keep) == (3, 4)
    assert from_launcher.directory.trust_pickles
    own = DurableCheckpoints.from_settings(str(tmp_path / "b"))
    assert own is not None and own.directory.url == str(tmp_path / "b")


def test_a_checkpoint_is_due_every_n_commits_or_after_the_interval(tmp_path: Path) -> None:
    from elastic.state.sharded.durable_checkpoint import DurableCheckpoints

    now = [0.0]
    checkpoints = DurableCheckpoints(
        ShardedCheckpointDir(str(tmp_path)), every=3, interval=60.0, clock=lambda: now[0]
    )
    assert checkpoints._due(1), "the first commit"
    checkpoints._last = (1, 0.0)
    assert [checkpoints._due(c) for c in (2, 3, 4)] == [False, False, True]
    now[0] = 61.0
    assert checkpoints._due(2)


def test_the_optimizer_step_is_adam_s_count() -> None:
    from elastic.state.sharded.durable_checkpoint import optimizer_step

    model = torch.nn.Linear(2, 1)
    adam = torch.optim.Adam(model.parameters())
    assert optimizer_step(adam) is None
    for _ in range(3):
        model(torch.ones(1, 2)).sum().backward()
        adam.step()
    assert optimizer_step(adam) == 3
    assert optimizer_step(torch.optim.SGD(model.parameters(), lr=0.1)) is None
