"""ShardedState in real Gloo groups of two processes: an FSDP2 model commits, loses a rank,
re-shards onto one from the lost rank's replica, grows back to two with a joiner that holds
nothing; after each re-form the gathered full state (parameters, Adam's moments and step
counts) equals the commit's bit for bit. Rounds are simulated: each forms a new default
group over a TCPStore, under its own prefix, as the worker runtime does.
"""

from __future__ import annotations

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
from tests.support.worker_group import WorkerGroupError, run_group
from tests.support.workers.sharded_checks import differing, full_state
from tests.support.workers.tiny_lm import VOCAB, TinyLM, build

HOSTS = ["host-a", "host-b"]


def build_sharing_memory(mesh: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The head made a second parameter over the embedding's memory after fully_shard: two
    parameters that re-sharding would make two."""
    model, _ = build(mesh)
    model.head.weight = nn.Parameter(model.embed.weight.detach())
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(state: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed * 10 + dist.get_rank())
    tokens = torch.randint(0, VOCAB, (4, 5), generator=gen).to(context.current().device)
    logits = state.model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()


def enter(
    store: dist.Store, number: int, members: list[int], me: int, hosts=HOSTS, device="cpu"
) -> None:
    """Form round `number` of `members` (process ids in rank order) over Gloo and install its
    context, whose tensors live on `device` (tests/gpu passes "cuda")."""
    rank, size = members.index(me), len(members)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"round{number}/", store), rank=rank, world_size=size,
        timeout=timedelta(seconds=30),
    )  # fmt: skip
    slot = SlotInfo(
        hostname=hosts[me], rank=rank, local_rank=0, local_size=1,
        cross_rank=rank, cross_size=size, size=size,
    )  # fmt: skip
    group = dist.group.WORLD
    assert group is not None
    context.activate(
        context.WorkerContext(slot=slot, round=number, group=group, device=torch.device(device))
    )


def leave() -> None:
    context.activate(None)
    dist.destroy_process_group()


def own_store(port: int) -> tuple[int, dist.Store]:
    """Leave the harness's group; a store of our own for the simulated rounds."""
    me = dist.get_rank()
    context.activate(None)
    dist.destroy_process_group()
    store = dist.TCPStore("127.0.0.1", port, 2, me == 0, timeout=timedelta(seconds=30))
    return me, store


def _shrink_then_grow(port: int, device: str = "cpu") -> dict[str, Any]:
    from elastic.state.sharded import ShardedState

    me, store = own_store(port)
    enter(store, 1, [0, 1], me, device=device)
    state = ShardedState(build, replicas=1, sampler=ElasticSampler(range(40)), steps=0)
    state.sync_if_needed(True)
    for commit in (1, 2):
        for seed in range(2):
            train_step(state, commit * 10 + seed)
            state.steps += 1
            state.sampler.record_batch(state.steps - 1, 2)
        state.commit()
    state.wait_replicated()  # commit 2 is held on the other host
    expected2 = full_state(state)
    train_step(state, 99)  # work after the last commit, lost with rank 1
    state.steps += 1
    leave()
    out: dict[str, Any] = {"expected2": expected2}
    if me == 1:  # it "dies" here and comes back as a joiner with nothing
        enter(store, 3, [0, 1], me, device=device)
        joiner = ShardedState(build, replicas=1, sampler=ElasticSampler(range(40)), steps=0)
        joiner.sync_if_needed(True)
        out.update(after_grow=full_state(joiner), steps=joiner.steps)
        out.update(processed=joiner.sampler.processed_num, restored=joiner.last_restore)
        return out
    state.restore()
    enter(store, 2, [0], me, device=device)
    state.on_reset()
    state.sync_if_needed(False)
    out.update(after_shrink=full_state(state), shrink_steps=state.steps)
    out.update(shrink_restored=state.last_restore, shrink_count=state.commit_count)
    train_step(state, 7)
    state.steps += 1
    state.commit()
    out["expected3"] = full_state(state)
    leave()
    enter(store, 3, [0, 1], me, device=device)
    state.on_reset()
    state.sync_if_needed(False)
    out.update(after_grow=full_state(state), steps=state.steps, restored=state.last_restore)
    out.update(shards=[tuple(p.to_local().shape) for p in state.model.parameters()])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_lost_rank_s_shards_come_from_its_replica_and_a_joiner_gets_its_rows() -> None:
    assert_shrink_then_grow(*run_group(_shrink_then_grow, 2, free_port(), timeout=120))


def assert_shrink_then_grow(rank0: dict[str, Any], rank1: dict[str, Any]) -> None:
    """What `_shrink_then_grow`'s two ranks must find (tests/gpu reuses it on CUDA)."""
    assert differing(rank0["expected2"], rank1["expected2"]) == []
    # 2 -> 1: rank 1's shards come from its replica on rank 0, the state is commit 2's
    assert differing(rank0["after_shrink"], rank0["expected2"]) == []
    assert rank0["shrink_steps"] == 4, "plain values roll back with the commit"
    assert rank0["shrink_restored"].commit == 2 and rank0["shrink_restored"].world == 2
    assert "shard(s) of 1 from rank 0 from replicas" in rank0["shrink_restored"].reason
    assert rank0["shrink_count"] == 2
    # 1 -> 2: the joiner receives its rows from rank 0; both hold commit 3's state
    for rank in (rank0, rank1):
        assert differing(rank["after_grow"], rank0["expected3"]) == []
        assert rank["steps"] == 5
        assert rank["restored"].commit == 3 and rank["restored"].world == 1
    assert rank1["processed"] == 16, "the sampler's processed samples come back with the commit"
    assert (VOCAB // 2 + 1, 6) in rank0["shards"], "11 rows shard 6-5 again over 2 ranks"


def _bad_build(port: int, case: str) -> str:
    from elastic.state.sharded import ShardedState, ShardedStateError

    me, store = own_store(port)
    hosts = ["localhost", "localhost"] if case == "one host" else HOSTS
    enter(store, 1, [0, 1], me, hosts)
    try:
        if case == "not sharded":
            state = ShardedState(lambda mesh: (TinyLM(), torch.optim.SGD(TinyLM().parameters())))
            state.sync_if_needed(True)
        elif case == "fixed mesh":
            first: list[Any] = []

            def fixed(mesh: Any) -> Any:
                first.append(mesh)
                return build(first[0])  # the mesh of the first round, whatever it is given

            state = ShardedState(fixed)
            state.sync_if_needed(True)
            leave()
            if me == 1:
                return "left"
            enter(store, 2, [0], me)
            state.sync_if_needed(False)
        elif case == "shared memory":
            state = ShardedState(build_sharing_memory)
            state.sync_if_needed(True)
        elif case == "too large":
            state = ShardedState(build, replicas=1, host_memory=1000)
            state.sync_if_needed(True)
        elif case == "no optimizer":
            state = ShardedState(lambda mesh: build(mesh)[0])
            state.sync_if_needed(True)
        else:
            state = ShardedState(build, replicas=1)
            state.sync_if_needed(True)
    except ShardedStateError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not sharded", "ShardedState: parameter 'embed.weight' is not sharded: build(mesh) "
                        "must apply fully_shard(module, mesh=mesh) to the model"),
        ("fixed mesh", "ShardedState: parameter 'embed.weight' is sharded over a mesh of 2 "
                       "rank(s), this round has 1: build(mesh) must shard over the mesh it is "
                       "given, not one it makes with a fixed size"),
        ("one host", "ShardedState(replicas=1) keeps each shard on 1 other host(s), but the "
                     "job has 1 host(s) (localhost)"),
        ("shared memory", "ShardedState: parameters 'embed.weight' and 'head.weight' share "
                          "memory without being one parameter"),
        ("too large", "ShardedState(replicas=1): commits need about "),
        ("no optimizer", "build(mesh) must return (model, optimizer)"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_on_every_rank_at_the_start(case: str, message: str) -> None:
    try:
        results = run_group(_bad_build, 2, free_port(), case, timeout=60)
    except WorkerGroupError as err:
        pytest.fail(str(err))
    for result in results:
        if result != "left":
            assert result.startswith(message), result
            assert "\n" not in result


def _leave_at_a_step(port: int) -> dict[str, Any]:
    """Rank 1 asks to leave after step 3 (commit 2 was at step 2); both check for host
    updates at the step boundary; rank 0 goes on alone from the state after step 3."""
    from elastic.state.sharded import ShardedState
    from elastic.worker.errors import HostsUpdatedInterrupt

    me, store = own_store(port)
    enter(store, 1, [0, 1], me)
    state = ShardedState(build, replicas=1, steps=0)
    state.sync_if_needed(True)
    for step in range(3):
        train_step(state, step)
        state.steps += 1
        if state.steps == 2:
            state.commit()
    if me == 1:
        context.current().events.request_leave("a test's drain")
    after_step_3 = full_state(state)
    try:
        state.check_host_updates()
        return {"interrupted": False}
    except HostsUpdatedInterrupt:
        pass
    leave()
    if me == 1:
        return {"interrupted": True}
    enter(store, 2, [0], me)
    state.on_reset()
    state.sync_if_needed(False)
    return {
        "interrupted": True, "expected": after_step_3, "after": full_state(state),
        "steps": state.steps, "count": state.commit_count, "restored": state.last_restore,
    }  # fmt: skip


def test_a_stop_at_a_step_boundary_keeps_the_state_after_that_step() -> None:
    rank0, rank1 = run_group(_leave_at_a_step, 2, free_port(), timeout=90)
    assert rank0["interrupted"] and rank1["interrupted"]
    assert differing(rank0["after"], rank0["expected"]) == [], "nothing rolled back"
    assert rank0["steps"] == 3
    assert rank0["count"] == 2, "the state after step 3 was committed as commit 2"
    assert rank0["restored"].commit == 2 and rank0["restored"].world == 2
