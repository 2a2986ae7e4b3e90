"""Durable checkpoints of ShardedState in real Gloo groups: a checkpoint written in the
background by 4 ranks (2 per host) loads bit for bit into a job of 2 and of 3 ranks (model,
Adam's moments and step counts, plain values, the sampler's processed samples), and a
checkpoint that was never finished (no marker) or is damaged is never the one loaded.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic.protocol.http import SlotInfo
from elastic.state import ElasticSampler
from elastic.worker import context
from tests.support.worker_group import run_group
from tests.support.workers.sharded_checks import differing, full_state
from tests.support.workers.tiny_lm import VOCAB, build


def train_step(state: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed * 10 + dist.get_rank())
    tokens = torch.randint(0, VOCAB, (4, 5), generator=gen)
    logits = state.model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()
    state.steps += 1
    state.sampler.record_batch(state.steps - 1, 2)


def join(port: int, hosts: list[str]) -> int:
    """Leave the harness's group and form a round of `len(hosts)` ranks whose ranks lie on
    `hosts`, as the worker runtime does; return this rank."""
    me, size = dist.get_rank(), len(hosts)
    context.activate(None)
    dist.destroy_process_group()
    store = dist.TCPStore("127.0.0.1", port, size, me == 0, timeout=timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("round1/", store), rank=me, world_size=size,
        timeout=timedelta(seconds=30),
    )  # fmt: skip
    slot = SlotInfo(
        hostname=hosts[me], rank=me, local_rank=0, local_size=1,
        cross_rank=me, cross_size=size, size=size,
    )  # fmt: skip
    group = dist.group.WORLD
    assert group is not None
    context.activate(
        context.WorkerContext(slot=slot, round=1, group=group, device=torch.device("cpu"))
    )
    return me


def hosts_of(size: int) -> list[str]:
    return [f"host-{'ab'[rank * 2 // size]}" for rank in range(size)]


def make_state(directory: str) -> Any:
    from elastic.state.sharded import ShardedState

    return ShardedState(
        build, replicas=1, checkpoint_dir=directory, sampler=ElasticSampler(range(64)), steps=0
    )


def _write(port: int, directory: str, size: int = 4) -> dict[str, Any]:
    """Train and commit twice, a checkpoint at each commit, each waited for."""
    join(port, hosts_of(size))
    state = make_state(directory)
    state.sync_if_needed(True)
    started = state.last_restore
    out: dict[str, Any] = {"started": started}
    for commit in (1, 2):
        for seed in range(2):
            train_step(state, commit * 10 + seed)
        state.commit()
        if commit == 1:
            assert state.durable_checkpoints.wait(60), "the checkpoint's write ends"
    # commit 2's checkpoint is written while training goes on: it holds commit 2's state
    out.update(expected=full_state(state), steps=state.steps, processed=state.sampler.processed_num)
    train_step(state, 50)
    train_step(state, 51)
    assert state.durable_checkpoints.wait(60)
    out["written"] = state.durable_checkpoints.written
    dist.barrier()
    return out


def _load(port: int, directory: str, size: int) -> dict[str, Any]:
    join(port, hosts_of(size))
    state = make_state(directory)
    state.sync_if_needed(True)  # a fresh job finds the checkpoint directory
    out = {"state": full_state(state), "steps": state.steps, "restored": state.last_restore}
    out.update(processed=state.sampler.processed_num, count=state.commit_count)
    train_step(state, 77)  # and it trains on
    state.commit()
    state.durable_checkpoints.wait(60)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def written(tmp_path: Any) -> tuple[str, list[dict[str, Any]]]:
    directory = str(tmp_path / "checkpoints")
    return directory, run_group(_write, 4, free_port(), directory, timeout=180)


@pytest.mark.parametrize("size", [2, 3])
def test_a_checkpoint_of_four_ranks_loads_bitwise_at_another_size(
    written: tuple[str, list[dict[str, Any]]], size: int
) -> None:
    directory, writers = written
    assert writers[0]["started"] is None, "no checkpoint yet: the job started from build()"
    assert all(w["written"] == 2 for w in writers)
    names = sorted(os.listdir(directory))
    assert names == [
        "sharded-000000000001-r1", "sharded-000000000001-r1.json",
        "sharded-000000000002-r1", "sharded-000000000002-r1.json",
    ]  # fmt: skip
    loaded = run_group(_load, size, free_port(), directory, size, timeout=180)
    for rank in loaded:
        assert differing(rank["state"], writers[0]["expected"]) == []
        assert rank["steps"] == 4 and rank["count"] == 2
        assert rank["restored"].commit == 2 and rank["restored"].world == 4
    # every sample the 4 ranks processed in the epoch is known processed, as at the commit
    assert all(rank["processed"] == writers[0]["processed"] == 32 for rank in loaded)


def test_an_unfinished_or_damaged_checkpoint_is_never_loaded(
    written: tuple[str, list[dict[str, Any]]],
) -> None:
    directory, writers = written
    # a newer checkpoint whose writers died before the marker: its files, no marker
    shutil.copytree(f"{directory}/sharded-000000000002-r1", f"{directory}/sharded-000000000009-r1")
    # the newest finished one is damaged: a rank's file cut short after its marker was written
    shard = f"{directory}/sharded-000000000002-r1/__1_0.distcp"
    with open(shard, "r+b") as file:
        file.truncate(os.path.getsize(shard) // 2)
    loaded = run_group(_load, 2, free_port(), directory, 2, timeout=180)
    for rank in loaded:
        assert rank["restored"].commit == 1, "the checkpoint before the damaged one"
        assert rank["steps"] == 2


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _lose_more_than_replicas(port: int, directory: str) -> dict[str, Any]:
    """2 ranks on 2 hosts with no replicas: rank 1's host is lost, rank 0 goes on alone
    from the checkpoint of commit 2, 3 steps after it."""
    from elastic.state.sharded import ShardedState

    me = join(port, ["host-a", "host-b"])
    state = ShardedState(
        build, replicas=0, checkpoint_dir=directory, sampler=ElasticSampler(range(64)), steps=0
    )
    state.sync_if_needed(True)
    for commit in (1, 2):
        for seed in range(2):
            train_step(state, commit * 10 + seed)
        state.commit()
        assert state.durable_checkpoints.wait(60)
    expected = full_state(state)
    for seed in range(3):
        train_step(state, 90 + seed)
    dist.barrier()
    if me == 1:
        return {}  # its host is lost
    lines = _Lines()
    logging.getLogger("elastic").addHandler(lines)
    state.restore()
    context.activate(None)
    dist.destroy_process_group()
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    slot = SlotInfo(
        hostname="host-a", rank=0, local_rank=0, local_size=1,
        cross_rank=0, cross_size=1, size=1,
    )  # fmt: skip
    group = dist.group.WORLD
    assert group is not None
    context.activate(
        context.WorkerContext(slot=slot, round=2, group=group, device=torch.device("cpu"))
    )
    state.on_reset()
    state.sync_if_needed(False)
    return {
        "differing": differing(full_state(state), expected),
        "steps": state.steps,
        "count": state.commit_count,
        "lines": lines.lines,
    }


def test_more_hosts_lost_than_replicas_cover_resume_from_the_checkpoint(tmp_path: Any) -> None:
    directory = str(tmp_path / "checkpoints")
    survivor, _ = run_group(_lose_more_than_replicas, 2, free_port(), directory, timeout=180)
    assert survivor["differing"] == []
    assert survivor["steps"] == 4 and survivor["count"] == 2
    assert (
        "more hosts lost than the 0 replicas cover: resuming from the durable checkpoint of "
        f"step 4 (commit 2) in {directory}, 3 steps lost"
    ) in survivor["lines"]
