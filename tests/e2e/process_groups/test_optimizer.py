"""DistributedOptimizer and the broadcasts in real Gloo groups, against one-process training."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from elastic.worker import context
from elastic.worker.collectives.broadcasts import broadcast
from elastic.worker.collectives.compression import Compression
from elastic.worker.context import NotInitializedError, current
from elastic.worker.driver_link.membership_events import HostsUpdate, MembershipEvents
from elastic.worker.errors import HostsUpdatedInterrupt
from elastic.worker.training.optimizer import DistributedOptimizer
from elastic.worker.training.state_broadcasts import (
    broadcast_optimizer_state,
    broadcast_parameters,
)
from tests.support.worker_group import run_group

STEPS = 3
BATCH = 4  # rows per rank and backward pass

# name -> (optimizer, backward_passes_per_step, fusion_threshold_bytes, fp16, explicit sync)
CONFIGS: dict[str, tuple[str, int, int, bool, bool]] = {
    "sgd": ("sgd", 1, 64 * 1024 * 1024, False, False),
    "sgd_many_buckets": ("sgd", 1, 64, False, True),
    "sgd_accumulate": ("sgd", 2, 100, False, False),
    "adam_many_buckets": ("adam", 1, 64, False, False),
    "adam_accumulate": ("adam", 2, 64 * 1024 * 1024, False, False),
    "sgd_fp16": ("sgd", 1, 200, True, False),
}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.randn(4))  # never used: its bucket is never ready
        self.fc1 = nn.Linear(6, 8)
        self.sometimes = nn.Parameter(torch.randn(3))  # used only on rank 0
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out * self.sometimes if use_sometimes else out


def _model() -> _Net:
    torch.manual_seed(0)
    return _Net()


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=0.05)


def _batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 100 * micro + rank)
    return torch.randn(BATCH, 6, generator=gen), torch.randn(BATCH, 3, generator=gen)


def _loss(model: _Net, step: int, micro: int, rank: int) -> torch.Tensor:
    x, y = _batch(step, micro, rank)
    return nn.functional.mse_loss(model(x, use_sometimes=rank == 0), y)


def _reference(config: str, size: int) -> dict[str, torch.Tensor]:
    """One process, every rank's shards in one batch: the mean of the ranks' losses."""
    kind, passes, _, _, _ = CONFIGS[config]
    model = _model()
    opt = _optimizer(kind, model)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            loss = sum(_loss(model, step, micro, r) for r in range(size)) / size
            loss.backward()
        opt.step()
    return model.state_dict()


def _distributed(config: str, model: nn.Module) -> torch.optim.Optimizer:
    """`config`'s optimizer over `model`, wrapped as its configuration says."""
    kind, passes, threshold, fp16, _ = CONFIGS[config]
    return DistributedOptimizer(
        _optimizer(kind, model),
        named_parameters=model.named_parameters(),
        compression=Compression.fp16 if fp16 else Compression.none,
        backward_passes_per_step=passes,
        fusion_threshold_bytes=threshold,
    )


def _train(config: str) -> dict[str, torch.Tensor]:
    kind, passes, _, _, explicit_sync = CONFIGS[config]
    rank = current("test").rank
    model = _model()
    opt = _distributed(config, model)
    assert isinstance(opt, torch.optim.SGD if kind == "sgd" else torch.optim.Adam)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            _loss(model, step, micro, rank).backward()
        if explicit_sync:
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    assert len(opt.state_dict()["state"]) == len(list(model.parameters()))
    return model.state_dict()


def _train_all() -> dict[str, Any]:
    results: dict[str, Any] = {name: _train(name) for name in CONFIGS}
    results["buckets"] = {
        name: len(_bucket_count_probe(CONFIGS[name][2])) for name in ("sgd", "sgd_many_buckets")
    }
    results["errors"] = _misuse_errors()
    return results


def _bucket_count_probe(threshold: int) -> list[Any]:
    model = _model()
    opt = DistributedOptimizer(
        torch.optim.SGD(model.parameters()), fusion_threshold_bytes=threshold
    )
    reducer = opt._reducer
    reducer.remove_hooks()
    return reducer.buckets


def _misuse_errors() -> list[str]:
    """Errors for misuse, raised identically on every rank."""
    rank = current("test").rank
    errors = []
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    _loss(model, 0, 0, rank).backward()
    try:
        _loss(model, 0, 1, rank).backward()
    except RuntimeError as e:
        errors.append("twice:" + str("backward_passes_per_step" in str(e)))
    opt.synchronize()
    opt.zero_grad()
    _loss(model, 0, 0, rank).backward()
    try:
        opt.zero_grad()
    except RuntimeError as e:
        errors.append("zero_grad:" + str("before" in str(e)))
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    errors.append("warned:" + str(any("skip_synchronize" in str(w.message) for w in caught)))
    _loss(model, 1, 0, rank).backward()  # one bucket, never complete: nothing launched
    opt.load_state_dict(opt.state_dict())  # drops the round, as an elastic restore does
    opt.zero_grad()
    errors.append("restored")
    for bad in ({"op": 3}, {"backward_passes_per_step": 0}, {"named_parameters": [("a", 1)]}):
        try:
            DistributedOptimizer(torch.optim.SGD(model.parameters()), **bad)
        except ValueError:
            errors.append("value_error")
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_distributed_optimizer_matches_single_process(size: int) -> None:
    results = run_group(_train_all, size)
    for config, (_, _, _, fp16, _) in CONFIGS.items():
        expected = _reference(config, size)
        tolerance = {"atol": 5e-3, "rtol": 5e-3} if fp16 else {"atol": 1e-5, "rtol": 1e-5}
        for result in results:
            for key, value in expected.items():
                torch.testing.assert_close(
                    result[config][key], value, **tolerance, msg=lambda m, k=key: f"{k}: {m}"
                )
    for result in results:
        assert result["buckets"] == {"sgd": 1, "sgd_many_buckets": 5}
        assert result["errors"] == [
            "twice:True",
            "zero_grad:True",
            "warned:True",
            "restored",
            "value_error",
            "value_error",
            "value_error",
        ]


def _broadcasts() -> dict[str, Any]:
    ctx = current("test")
    rank, root = ctx.rank, ctx.size - 1
    torch.manual_seed(rank)
    model = _Net()
    model.register_buffer("transposed", torch.randn(3, 4).t())  # not contiguous
    model.register_buffer("steps", torch.tensor(rank, dtype=torch.int64))
    broadcast_parameters(model.state_dict(), root_rank=root)
    from_state_dict = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(100 + rank)
    other = _Net()
    broadcast_parameters(other.named_parameters(), root_rank=root)

    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    for step in range(rank + 1):
        _loss(model, step, 0, rank).backward()
        opt.step()
    broadcast_optimizer_state(opt, root_rank=root)
    return {
        "state_dict": from_state_dict,
        "named": dict(other.named_parameters()),
        "optimizer": opt.state_dict(),
    }


@pytest.mark.parametrize("size", [2, 3])
def test_broadcasts_make_ranks_equal(size: int) -> None:
    results = run_group(_broadcasts, size)
    root = results[-1]
    torch.manual_seed(size - 1)
    fresh = _Net()
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(root["state_dict"][key], value)
    assert root["state_dict"]["steps"].item() == size - 1
    for result in results:
        for key, value in root["state_dict"].items():
            torch.testing.assert_close(result["state_dict"][key], value)
        for key, value in root["named"].items():
            torch.testing.assert_close(result["named"][key], value)
        opt, root_opt = result["optimizer"], root["optimizer"]
        assert opt["param_groups"] == root_opt["param_groups"]
        assert opt["state"].keys() == root_opt["state"].keys()
        for index, state in root_opt["state"].items():
            for name, value in state.items():
                torch.testing.assert_close(opt["state"][index][name], value)


@pytest.mark.parametrize(
    "call",
    [
        lambda: DistributedOptimizer(torch.optim.SGD([nn.Parameter(torch.ones(1))])),
        lambda: broadcast_parameters({"a": torch.ones(1)}, 0),
        lambda: broadcast_optimizer_state(torch.optim.SGD([nn.Parameter(torch.ones(1))]), 0),
    ],
)
def test_optimizer_calls_before_init_raise_not_initialized(call: Any) -> None:
    with pytest.raises(NotInitializedError):
        call()


def _interrupted_at_a_step(config: str, word: str) -> dict[str, Any]:
    """Train 8 steps; during step 3 one rank gets the `word`: "leave" (rank 2 is asked to
    leave: SIGTERM, a preemption notice) or "round" (only rank 1 hears of the driver's newer
    round, which brings a joiner). Returns where `optimizer.step()` raised and what."""
    ctx = current("test")
    model = _model()
    opt = _distributed(config, model)
    after: list[list[list[float]]] = []
    for step in range(8):
        if word == "leave" and ctx.rank == 2 and step == 3:
            ctx.events.request_leave()
        if word == "round" and ctx.rank == 1 and step == 3:
            ctx.events.hosts_updated(HostsUpdate(ctx.round + 1, added=True, removed=False))
        opt.zero_grad()
        _loss(model, step, 0, ctx.rank).backward()
        try:
            opt.step()
        except HostsUpdatedInterrupt as interrupt:
            unchanged = [p.tolist() for p in model.parameters()] == after[-1]
            return {"at": step, "interrupt": (interrupt.at_step, interrupt.skip_sync),
                    "unchanged": unchanged, "params": after[-1]}  # fmt: skip
        after.append([p.tolist() for p in model.parameters()])
    return {"at": None}


@pytest.mark.parametrize("config", ["sgd", "adam_many_buckets", "sgd_fp16"])
def test_a_leaving_member_stops_every_rank_at_the_same_step_boundary(config: str) -> None:
    """A member told to leave during step 3 puts its word in step 3's gradient allreduce:
    every rank raises at the start of step 4's `optimizer.step()`, before it changes
    anything, so the ranks hold the same state, that of step 3."""
    outs = run_group(_interrupted_at_a_step, 3, config, "leave", timeout=60)
    assert [o["at"] for o in outs] == [4, 4, 4]
    assert all(o["interrupt"] == (True, True) and o["unchanged"] for o in outs)
    assert outs[0]["params"] == outs[1]["params"] == outs[2]["params"]


@pytest.mark.parametrize("config", ["sgd", "adam_many_buckets", "sgd_fp16"])
def test_a_worker_joining_stops_every_rank_at_the_next_step_not_the_next_commit(
    config: str,
) -> None:
    """The driver announced a round with a joiner, and one rank heard of it during step 3: its
    word in step 3's gradient allreduce stops every rank at the start of step 4's
    `optimizer.step()`, before it changes anything, with no commit in sight. The rank that
    heard expects a sync (a worker joins); the others, who did not hear yet, do not say so,
    and the joiner's own sync brings the state to all (`State.sync_if_needed`)."""
    outs = run_group(_interrupted_at_a_step, 3, config, "round", timeout=60)
    assert [o["at"] for o in outs] == [4, 4, 4]
    assert [o["interrupt"] for o in outs] == [(True, True), (True, False), (True, True)]
    assert all(o["unchanged"] for o in outs)
    assert outs[0]["params"] == outs[1]["params"] == outs[2]["params"]


def _word_of_an_ended_round() -> bool:
    ctx = current("test")
    model = _model()
    opt = _distributed("sgd", model)
    for step in range(4):
        if ctx.rank == 2 and step == 1:
            ctx.events.request_leave()  # agreed in step 1's allreduce...
        if step == 2:  # ...but the round ended first (at a commit): a new round, same group
            ctx = dataclasses.replace(ctx, round=ctx.round + 1, events=MembershipEvents())
            context.activate(ctx)
        opt.zero_grad()
        _loss(model, step, 0, ctx.rank).backward()
        try:
            opt.step()
        except HostsUpdatedInterrupt:
            return False
    return True


def test_a_leave_agreed_in_a_round_that_ended_otherwise_stops_nobody_in_the_next() -> None:
    """The new round's members did not all hear the word (joiners did not): acting on it
    there would split the ranks, some leaving the group while others wait in it."""
    assert run_group(_word_of_an_ended_round, 3, timeout=60) == [True, True, True]


# --- issue 27: what Horovod code reads of the optimizer --------------------------------------


def _state_without_grad() -> dict[str, Any]:
    """Horovod's test_broadcast_state_no_grad: a parameter without gradient in a new
    DistributedOptimizer's state."""

    class ModelNoGrad(torch.nn.Module):
        def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(a.int(), requires_grad=False)
            self.b = torch.nn.Parameter(b)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.index_select(self.b, 0, self.a.long()) * x

    torch.manual_seed(current("test").rank)
    model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True
    )
    optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    broadcast_parameters(model.state_dict(), root_rank=0)
    before = model.b.detach().clone()
    broadcast_optimizer_state(optimizer, root_rank=0)
    grad = optimizer.param_groups[0]["params"][1].grad
    bgrad = broadcast(grad, root_rank=0)
    return {
        "grad_of_a": optimizer.param_groups[0]["params"][0].grad,
        "grad": grad,
        "bgrad": bgrad,
        "b_kept": torch.equal(model.b.detach(), before),
        "momentum": optimizer.state[model.b]["momentum_buffer"],
    }


@pytest.mark.parametrize("size", [2, 3])
def test_broadcast_optimizer_state_gives_a_new_optimizer_horovods_state(size: int) -> None:
    for result in run_group(_state_without_grad, size):
        assert result["grad_of_a"] is None
        torch.testing.assert_close(result["grad"], torch.zeros(4))
        torch.testing.assert_close(result["bgrad"], result["grad"])
        assert result["b_kept"]
        assert result["momentum"].shape == (4,)


def _parameter_names() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    first, second = list(model[0].parameters()), list(model[1].parameters())
    groups = [{"params": first}, {"params": second, "lr": 0.01}]
    unnamed = DistributedOptimizer(torch.optim.SGD(groups, lr=0.1))
    named = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    return {
        "unnamed": [unnamed._parameter_names[p] for p in [*first, *second]],
        "named": [named._parameter_names[p] for p in model.parameters()],
        "attributes": (named.backward_passes_per_step, int(named.op), named.sparse_as_dense),
    }


@pytest.mark.parametrize("size", [2, 3])
def test_distributed_optimizer_keeps_horovods_parameter_name_table(size: int) -> None:
    for result in run_group(_parameter_names, size):
        assert result["unnamed"] == [
            "allreduce.noname.0.0",
            "allreduce.noname.0.1",
            "allreduce.noname.1.0",
            "allreduce.noname.1.1",
        ]
        assert result["named"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
        assert result["attributes"] == (1, 0, False)


def _sparse_gradient_on_some_ranks(sparse_as_dense: bool) -> dict[str, Any]:
    """An embedding (sparse gradients) that only the even ranks use in a step, beside a
    dense layer every rank uses."""
    rank = current("test").rank
    torch.manual_seed(0)
    emb, dense = nn.Embedding(6, 2, sparse=True), nn.Linear(2, 1)
    optimizer = DistributedOptimizer(
        torch.optim.SGD([*emb.parameters(), *dense.parameters()], lr=1.0),
        sparse_as_dense=sparse_as_dense,
    )
    loss = dense(torch.ones(1, 2)).sum()
    if rank % 2 == 0:
        loss = loss + emb(torch.tensor([rank, 5])).sum()
    loss.backward()
    optimizer.step()
    return {"emb": emb.weight.detach().clone(), "dense": dense.weight.detach().clone()}


@pytest.mark.parametrize("sparse_as_dense", [False, True])
@pytest.mark.parametrize("size", [2, 3])
def test_sparse_gradients_are_reduced_when_only_some_ranks_have_them(
    size: int, sparse_as_dense: bool
) -> None:
    results = run_group(_sparse_gradient_on_some_ranks, size, sparse_as_dense)
    torch.manual_seed(0)
    expected = nn.Embedding(6, 2, sparse=True).weight.detach().clone()
    for rank in range(0, size, 2):
        expected[rank] -= 1.0 / size  # each row's gradient is ones, averaged over the ranks
        expected[5] -= 1.0 / size
    for result in results:
        torch.testing.assert_close(result["emb"], expected)
        torch.testing.assert_close(result["dense"], results[0]["dense"])
