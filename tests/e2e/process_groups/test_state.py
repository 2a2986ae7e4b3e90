"""State, ObjectState, TorchState and ElasticSampler, in real Gloo groups where collectives run.

Membership changes are simulated inside one process group: a sub-group of ranks 0 and 1 plays
the round after rank 2 died or left, and the full group the round in which it (re)joins.
"""

from __future__ import annotations

import itertools
import math
import pickle
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from elastic.state import ElasticSampler, ObjectState, State, TorchState
from elastic.state.sampler import merge_sampler_states
from elastic.worker import context
from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.reduce_ops import Sum
from elastic.worker.driver_link.membership_events import HostsUpdate, MembershipEvents
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError
from tests.support.worker_group import activate_on_one_host, run_group

N = 101  # samples in the sampler tests: not divisible by 2, 3 or the batch size
BATCH = 3


def _activate(rank: int, size: int, round_: int, group: Any) -> context.WorkerContext:
    return activate_on_one_host(rank, size, round_, group)


def _plain(value: Any) -> Any:
    """Tensors to nested lists, for comparing states across processes."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))


def _step(model: nn.Module, optimizers: list[torch.optim.Optimizer], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen)
    for opt in optimizers:
        opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for opt in optimizers:
        opt.step()


def _torch_digest(state: TorchState) -> dict[str, Any]:
    return {
        "model": _plain(state.model.state_dict()),
        "optimizer": _plain(state.optimizer.state_dict()),
        "value": state.value,
        "count": state.commit_count,
    }


# --- pure -----------------------------------------------------------------------------------


def test_exceptions() -> None:
    for skip in (False, True):
        err = pickle.loads(pickle.dumps(HostsUpdatedInterrupt(skip_sync=skip)))
        assert isinstance(err, RuntimeError) and err.skip_sync is skip
    assert HostsUpdatedInterrupt().skip_sync is False
    assert issubclass(WorkerLostError, RuntimeError)


def test_sampler_without_context_and_merge() -> None:
    a, b = ElasticSampler(range(N), seed=3), ElasticSampler(list(range(N)), seed=3)
    assert (a.rank, a.num_replicas, len(a)) == (0, 1, N)
    assert list(a) == list(b) and sorted(a) == list(range(N)) and list(a) != list(range(N))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(N))
    a.set_epoch(0)
    assert list(a) == first
    assert list(ElasticSampler(range(N), shuffle=False)) == list(range(N))
    assert list(ElasticSampler(range(N), seed=4)) != first

    a.record_batch(0, 10)
    a.record_indices([first[50], first[50]])
    assert a.processed_indices == set(first[:10]) | {first[50]}
    a.reset()
    assert len(a) == N - 11 and list(a) == first[10:50] + first[51:]
    saved = a.state_dict()
    a.set_epoch(2)
    assert a.processed_indices == set()
    a.load_state_dict(saved)
    assert a.epoch == 0 and list(a) == first[10:50] + first[51:]
    for bad in ([N], [-1]):
        with pytest.raises(IndexError):
            a.record_indices(bad)
    with pytest.raises(ValueError):
        a.record_batch(0, 0)

    merged = merge_sampler_states(
        [
            {"epoch": 2, "processed_indices": torch.tensor([1, 5])},
            {"epoch": 1, "processed_indices": [7]},  # older epoch: stale
            {"epoch": 2, "processed_indices": {5, 9}},
        ],
        root=0,
    )
    assert merged["epoch"] == 2 and merged["processed_indices"].tolist() == [1, 5, 9]


def test_names_that_would_hide_the_api_are_refused() -> None:
    for name in ("commit", "sync", "_saved", "commit_count"):
        with pytest.raises(ValueError):
            ObjectState(**{name: 1})
    with pytest.raises(ValueError):
        TorchState(restore=nn.Linear(1, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_state_cuda_snapshots_live_on_the_host() -> None:
    model = _net(0).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state = TorchState(model, opt)
    _step(model, [opt], 1)
    state.save()
    expected = _plain(model.state_dict())
    saved = [state._handlers[n].saved for n in ("model", "optimizer")]
    flat = list(saved[0].values()) + [t for s in saved[1]["state"].values() for t in s.values()]
    assert all(t.device.type == "cpu" for t in flat)
    _step(model, [opt], 2)
    state.restore()
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert all(
        t.device.type == "cuda" for s in opt.state.values() for k, t in s.items() if k != "step"
    )
    assert _plain(model.state_dict()) == expected


# --- commit and restore ---------------------------------------------------------------------


def _round_trips() -> dict[str, Any]:
    out: dict[str, Any] = {}
    rank = context.current().rank

    obj = ObjectState(epoch=0, history=[1, 2], meta={"lr": 0.1})
    obj.epoch, obj.history = 3, [1, 2, 3]
    obj.commit()
    obj.epoch = 4
    obj.history.append(4)  # in place: the snapshot must be a copy
    obj.meta["lr"] = 1.0
    obj.restore()
    out["object"] = (obj.epoch, list(obj.history), dict(obj.meta), obj.commit_count)
    obj.history.append(5)
    obj.restore()
    out["object_again"] = obj.history

    model, model2 = _net(rank), _net(10 + rank)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model2.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    state = TorchState(model, sgd, model2=model2, adam=adam, scheduler=sched, value=0)
    _step(model, [sgd], 1)
    _step(model2, [adam], 1)
    state.value = 1
    state.commit()

    def snapshot() -> Any:
        return [_plain(x.state_dict()) for x in (model, model2, sgd, adam, sched)] + [state.value]

    committed = snapshot()
    for seed in (2, 3):
        _step(model, [sgd], seed)
        _step(model2, [adam], seed)
        sched.step()
    state.value = 2
    out["changed"] = snapshot() != committed
    state.restore()
    out["restored"] = snapshot() == committed
    # the same step from the restored state gives the same result: optimizer state is whole
    _step(model, [sgd], 2)
    _step(model2, [adam], 2)
    after_one_step = snapshot()
    state.restore()
    out["restored_twice"] = snapshot() == committed
    _step(model, [sgd], 2)
    _step(model2, [adam], 2)
    out["deterministic"] = snapshot() == after_one_step

    live = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
    live += [t.untyped_storage().data_ptr() for s in sgd.state.values() for t in s.values()]
    saved = [state._handlers[n].saved for n in ("model", "optimizer")]
    snap = list(saved[0].values()) + [t for s in saved[1]["state"].values() for t in s.values()]
    out["snapshots_cpu"] = all(t.device.type == "cpu" for t in snap)
    out["snapshot_aliases"] = [t.untyped_storage().data_ptr() in live for t in snap]

    state.model = replacement = _net(99)  # a handled name: tracked and snapshotted at once
    at_assignment = _plain(replacement.state_dict())
    with torch.no_grad():
        replacement[0].weight.add_(1.0)
    state.restore()
    out["replaced_restored"] = _plain(state.model.state_dict()) == at_assignment
    try:
        state.adam = "not an optimizer"
        out["bad_type"] = None
    except TypeError as e:
        out["bad_type"] = str(e)
    out["none_attrs"] = TorchState(value=1).model is None
    return out


def test_commit_restore_round_trips() -> None:
    for out in run_group(_round_trips, 2, timeout=30):
        assert out["object"] == (3, [1, 2, 3], {"lr": 0.1}, 1)
        assert out["object_again"] == [1, 2, 3]
        assert out["changed"] and out["restored"] and out["restored_twice"]
        assert out["deterministic"]
        assert out["snapshots_cpu"] and not any(out["snapshot_aliases"])
        assert out["replaced_restored"]
        assert out["bad_type"] and "cannot become a str" in out["bad_type"]
        assert out["none_attrs"]


# --- sync and membership checks -------------------------------------------------------------


def _divergent_state(rank: int) -> TorchState:
    model = _net(rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    _step(model, [opt], 100 + rank)
    return TorchState(model, opt, value=10 * rank, seen=[rank])


def _commit_interrupts(state: State, announce: Any, at: int = 2) -> tuple[int, bool] | None:
    """Commit five times; call `announce(events)` before commit `at` on this rank. Returns
    (commit index, skip_sync) of the interrupt, or None."""
    ctx = context.current()
    ctx.events = MembershipEvents()
    for i in range(5):
        if i == at:
            announce(ctx.events)
        try:
            state.commit()
        except HostsUpdatedInterrupt as e:
            return i, e.skip_sync
    return None


def _sync_and_updates() -> dict[str, Any]:
    rank = context.current().rank
    out: dict[str, Any] = {}
    spare = ObjectState()  # commits on it keep the collectives in step with the other ranks

    # rank 1 committed twice, rank 0 once, rank 2 is a fresh joiner (never committed)
    state = _divergent_state(rank)
    plan = {0: [state, spare], 1: [state, state], 2: [spare, spare]}[rank]
    for i, target in enumerate(plan):
        if i == 1 and target is state:
            _step(state.model, [state.optimizer], 200)
            state.value += 1
        target.commit()
    out["before"] = _torch_digest(state)
    out["newest"] = state.newest_commit_rank()
    state.restore()
    state.sync()
    out["synced"] = _torch_digest(state)
    _step(state.model, [state.optimizer], 300 + rank)
    state.value = -1
    state.restore()  # back to the synced state: sync made it the snapshot
    out["restored"] = _torch_digest(state)

    # the fresh joiner is rank 0: it is not the source although it has the lowest rank
    state = _divergent_state(rank)
    (spare if rank == 0 else state).commit()
    out["newest_joiner0"] = state.newest_commit_rank()
    out["before_joiner0"] = _torch_digest(state)
    state.sync()
    out["synced_joiner0"] = _torch_digest(state)
    out["newest_none"] = ObjectState(x=rank).newest_commit_rank()
    fresh = ObjectState(x=rank, items=[rank])
    fresh.sync()
    out["fresh_synced"] = (fresh.x, fresh.items, fresh.commit_count)

    # membership: one rank hears of a new round; everyone raises at the same commit
    def update(added: bool, on: int, next_round: int = 2) -> Any:
        def announce(events: MembershipEvents) -> None:
            if rank == on:
                events.hosts_updated(HostsUpdate(next_round, added=added, removed=not added))

        return announce

    def leave(events: MembershipEvents) -> None:
        if rank == 1:
            events.request_leave()

    out["none"] = _commit_interrupts(state, lambda events: None)
    out["added"] = _commit_interrupts(state, update(True, on=2))
    out["removed"] = _commit_interrupts(state, update(False, on=0), at=3)
    out["stale"] = _commit_interrupts(state, update(True, on=1, next_round=1))
    out["leave"] = _commit_interrupts(state, leave)

    # before the interrupt, samplers merge what each rank recorded on its own
    sampler = ElasticSampler(range(N))
    tracked = TorchState(sampler=sampler)
    sampler.record_indices([rank, 50 + rank])
    out["merge"] = _commit_interrupts(tracked, leave, at=0)
    sampler.record_indices([99])  # uncommitted: restore forgets it
    tracked.restore()
    out["merged"] = sorted(sampler.processed_indices)
    return out


def test_sync_from_newest_commit_and_host_updates() -> None:
    outs = run_group(_sync_and_updates, 3, timeout=30)
    assert [o["newest"] for o in outs] == [(1, 2)] * 3
    assert [o["before"]["count"] for o in outs] == [1, 2, 0]
    assert outs[0]["before"] != outs[1]["before"]
    for o in outs:
        assert o["synced"] == outs[1]["before"]
        assert o["restored"] == outs[1]["before"]
    assert [o["newest_joiner0"] for o in outs] == [(1, 1)] * 3
    for o in outs:
        assert o["synced_joiner0"] == outs[1]["before_joiner0"]
    assert outs[0]["before_joiner0"] != outs[1]["before_joiner0"]
    assert [o["newest_none"] for o in outs] == [(0, 0)] * 3
    assert [o["fresh_synced"] for o in outs] == [(0, [0], 0)] * 3

    for o in outs:
        assert o["none"] is None
        assert o["added"] == (2, False)
        assert o["removed"] == (3, True)
        assert o["stale"] is None  # next_round 1 is not newer than the current round 1
        assert o["leave"] == (2, True)
        assert o["merge"] == (0, True)
        assert o["merged"] == [0, 1, 2, 50, 51, 52]


def _sync_only_where_needed() -> dict[str, Any]:
    rank = context.current().rank
    out: dict[str, Any] = {}
    spare = ObjectState()  # commits on it keep the collectives in step with the other ranks
    state = ObjectState(value=0)
    state.sync()
    # Equal counts mean equal states by contract; a per-rank value (against the contract)
    # shows whether a sync ran.
    state.value = 10 + rank
    state.commit()
    state.sync_if_needed(False)
    out["equal_counts"] = (state.value, state.commit_count)
    # Rank 1 committed once more before a peer died: after the restore, the newest wins.
    state.value = 20 + rank
    (state if rank == 1 else spare).commit()
    state.restore()
    state.sync_if_needed(False)
    out["counts_differ"] = (state.value, state.commit_count)
    # Indices that only rank 2 recorded are merged, although the counts agree.
    torch_state = TorchState(sampler=ElasticSampler(range(N), seed=7))
    torch_state.sync()
    if rank == 2:
        torch_state.sampler.record_indices([5, 6])
    torch_state.commit()
    torch_state.restore()
    torch_state.sync_if_needed(False)
    out["merged"] = (sorted(torch_state.sampler.processed_indices), torch_state.sampler.unshared)
    return out


def test_after_a_restore_state_is_synced_only_where_the_ranks_differ() -> None:
    """The run loop's sync after a failure: skipped when every survivor holds the same commit
    (a large model is not broadcast for nothing), done when the commits differ or a rank
    recorded samples the others do not know."""
    outs = run_group(_sync_only_where_needed, 3, timeout=30)
    assert [o["equal_counts"] for o in outs] == [(10, 1), (11, 1), (12, 1)]  # not synced
    assert [o["counts_differ"] for o in outs] == [(21, 2)] * 3
    assert [o["merged"] for o in outs] == [([5, 6], False)] * 3


# --- sampler accounting across a failure, a join and a leave --------------------------------


class _Counter(nn.Module):
    """A "model" that counts how often each sample went into it."""

    def __init__(self, garbage: bool = False) -> None:
        super().__init__()
        init = torch.randint(5, 9, (N,)) if garbage else torch.zeros(N, dtype=torch.int64)
        self.register_buffer("counts", init)


def _train(state: TorchState, first: int, stop: int | None) -> None:
    """Batches `first` to `stop` (None: to the end of the epoch) of a plain DataLoader loop
    over the current shards; padding repeats are not counted. The shards are padded to one
    length, so every rank issues the same allreduces."""
    loader = DataLoader(range(N), sampler=state.sampler, batch_size=BATCH)
    for k, indices in itertools.islice(enumerate(loader), first, stop):
        local = torch.zeros(N, dtype=torch.int64)
        local[indices[~state.sampler.padding_mask(k, BATCH)]] += 1
        state.model.counts += allreduce(local, op=Sum)
        state.sampler.record_batch(k, BATCH)


def _counts(state: TorchState) -> dict[str, Any]:
    state.sampler.reset()  # the shard left, as a re-formed round would compute it
    return {
        "counts": state.model.counts.tolist(),
        "processed": len(state.sampler.processed_indices),
        "left": len(state.sampler),
    }


def _elastic_epochs() -> dict[str, Any]:
    world = context.current()
    rank = world.rank
    pair = dist.new_group([0, 1])  # every rank takes part in creating it
    out: dict[str, Any] = {}
    state = TorchState(model=_Counter(), sampler=ElasticSampler(range(N), seed=7))
    state.sync()
    out["shard"] = list(state.sampler)

    # data epoch 0 on 3 ranks (round 1): commit after 3 batches; batch 3 is lost when rank 2 dies
    _train(state, 0, 3)
    state.commit()
    _train(state, 3, 4)
    if rank < 2:  # round 2: ranks 0 and 1 restore, re-form, sync, go on
        _activate(rank, 2, 2, pair)
        state.restore()
        state.on_reset()
        state.sync()
        out["after_failure"] = _counts(state)
        _train(state, 0, 4)
        state.commit()
    else:  # rank 2 comes back as a fresh worker with garbage state
        state = TorchState(model=_Counter(garbage=True), sampler=ElasticSampler(range(N), seed=7))
    _activate(rank, 3, 3, world.group)  # round 3: all three again
    state.on_reset()
    state.sync()
    out["after_join"] = _counts(state)
    _train(state, 0, None)
    state.commit()
    out["epoch0"] = _counts(state)

    # data epoch 1: rank 2 is asked to leave (then round 4); no restore, no sync, only a re-shard
    state.sampler.set_epoch(1)
    state.model.counts.zero_()
    state.commit()
    out["epoch1_shard"] = list(state.sampler)
    _train(state, 0, 2)
    if rank == 2:
        context.current().events.request_leave()
    try:
        state.commit()
    except HostsUpdatedInterrupt as e:
        out["interrupt"] = e.skip_sync
    if rank < 2:
        _activate(rank, 2, 4, pair)
        state.on_reset()
        _train(state, 0, None)
        state.commit()
        out["epoch1"] = _counts(state)
    return out


def test_sampler_exactly_once_across_failure_join_and_leave() -> None:
    outs = run_group(_elastic_epochs, 3, timeout=30)
    shards = [o["shard"] for o in outs]
    assert {i for s in shards for i in s} == set(range(N))
    assert [len(s) for s in shards] == [34] * 3  # padded: one sample is repeated
    done = 3 * 3 * BATCH  # 3 committed batches on 3 ranks
    assert outs[0]["after_failure"] == outs[1]["after_failure"]
    assert sum(outs[0]["after_failure"]["counts"]) == outs[0]["after_failure"]["processed"] == done
    done += 4 * 2 * BATCH
    for o in outs:
        assert sum(o["after_join"]["counts"]) == o["after_join"]["processed"] == done
        assert o["after_join"]["left"] == math.ceil((N - done) / 3)
        assert o["epoch0"] == {"counts": [1] * N, "processed": N, "left": 0}
        assert o["interrupt"] is True
    epoch1 = [o["epoch1_shard"] for o in outs]
    assert {i for s in epoch1 for i in s} == set(range(N)) and epoch1 != shards
    for o in outs[:2]:
        assert o["epoch1"] == {"counts": [1] * N, "processed": N, "left": 0}
