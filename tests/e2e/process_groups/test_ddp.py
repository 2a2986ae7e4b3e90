"""hvd.elastic.DistributedDataParallel in real 2-rank Gloo groups, and what it refuses.

A re-form is played inside one job of two processes: a second process group over the same
ranks, installed as round 2's context, is the group the runtime would form after a re-form.
Torch's own DDP, trained on the same data in the same processes, is the reference.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from elastic.state import ObjectState, TorchState
from elastic.worker import context
from elastic.worker.context import NotInitializedError
from elastic.worker.errors import WorkerLostError
from elastic.worker.training.ddp import DistributedDataParallel
from elastic.worker.training.ddp_checks import UnsupportedModelError
from tests.support.worker_group import activate_on_one_host, run_group

SMALL_BUCKETS = {"bucket_cap_mb": 0.0002}  # a bucket or two per layer: several per step


def _net(seed: int, norm: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    middle = nn.BatchNorm1d(16) if norm else nn.Identity()
    return nn.Sequential(nn.Linear(6, 16), middle, nn.ReLU(), nn.Linear(16, 2))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int) -> None:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 2, generator=gen)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def _digest(module: nn.Module) -> dict[str, list]:
    return {k: v.tolist() for k, v in module.state_dict().items()}


def _parameters(digest: dict[str, list]) -> dict[str, list]:
    return {k: v for k, v in digest.items() if "running" not in k and "batches" not in k}


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _train_in_one_round(options: dict[str, Any]) -> dict[str, Any]:
    rank = context.current().rank
    out = {}
    for kind, wrap in (("torch", TorchDDP), ("elastic", DistributedDataParallel)):
        module = _net(seed=rank)  # each rank its own init: the build broadcasts rank 0's
        model = wrap(module, **SMALL_BUCKETS, **options)
        optimizer = _sgd(model)
        for step in range(3):
            _step(model, optimizer, step, rank)
        with model.no_sync():  # gradient accumulation: reduced at the next backward
            model(torch.ones(4, 6)).sum().backward()
        _step(model, optimizer, 3, rank)
        out[kind] = _digest(module)
    return out


@pytest.mark.parametrize(
    "options",
    [{}, {"find_unused_parameters": True, "gradient_as_bucket_view": True}, {"static_graph": True}],
    ids=["default", "unused-and-views", "static-graph"],
)
def test_in_one_round_the_wrapper_trains_as_torch_s_ddp(options: dict[str, Any]) -> None:
    """Parameters and buffers (broadcast from rank 0 before each forward, then updated by
    this rank's batch, as torch's DDP does) are bit for bit torch's DDP's, in DDP's modes."""
    outs = run_group(_train_in_one_round, 2, options)
    assert [o["elastic"] for o in outs] == [o["torch"] for o in outs]
    assert _parameters(outs[0]["elastic"]) == _parameters(outs[1]["elastic"])


def _lose_a_step_then_reform() -> dict[str, Any]:
    ctx = context.current()
    rank = ctx.rank
    side, round2 = dist.new_group([0, 1]), dist.new_group([0, 1])
    module = _net(seed=rank, norm=False)  # no buffers: no broadcast before the forward
    model = DistributedDataParallel(module, **SMALL_BUCKETS)
    optimizer = _sgd(model)
    state = TorchState(model=model, optimizer=optimizer)
    out: dict[str, Any] = {"parameters": [id(p) for p in model.parameters()]}
    for step in range(2):
        _step(model, optimizer, step, rank)
    state.commit()
    # Step 2: rank 1 stops answering; the driver breaks the round; rank 0's backward gives up.
    # Rank 1 runs its half only after that, so that rank 0's launched allreduces complete.
    # (A peer hung in the buffers' broadcast before a forward is noticed the same way.)
    if rank == 0:
        timer = threading.Timer(0.3, ctx.events.break_round, (ctx.round, "rank 1 is hung"))
        timer.start()
        started = time.monotonic()
        try:
            _step(model, optimizer, 2, rank)
        except WorkerLostError as err:
            out["lost"] = (str(err), time.monotonic() - started)
        timer.cancel()
        dist.barrier(group=side)
    else:
        dist.barrier(group=side)
        _step(model, optimizer, 2, rank)
    state.restore()  # what hvd.elastic.run does on WorkerLostError, then the next round:
    activate_on_one_host(rank, 2, 2, round2)
    state.sync_if_needed(False)
    for step in (3, 4):
        _step(model, optimizer, step, rank)
    out["elastic"] = _digest(module)
    out["parameters_after"] = [id(p) for p in model.parameters()]
    out["bound_to_round2"] = model._group is round2
    # The reference: torch's DDP over steps 0, 1, 3 and 4 (step 2 was rolled back).
    reference = _net(seed=rank, norm=False)
    ddp = TorchDDP(reference, process_group=round2, **SMALL_BUCKETS)
    optimizer = _sgd(ddp)
    for step in (0, 1, 3, 4):
        _step(ddp, optimizer, step, rank)
    out["torch"] = _digest(reference)
    return out


def test_a_step_lost_to_a_hung_peer_rolls_back_and_the_next_round_s_ddp_trains_on() -> None:
    """The gradient reduction waits through the runtime: a broken round raises
    WorkerLostError out of backward (torch's DDP would block until the collective timeout);
    after the restore, the first forward of round 2 builds a DDP on round 2's group, the
    half-done DDP of round 1 leaves no hook behind, and training goes on from the commit."""
    outs = run_group(_lose_a_step_then_reform, 2)
    message, seconds = outs[0]["lost"]
    assert message == "round 1 is broken: rank 1 is hung"
    assert seconds < 2.0
    assert all(o["bound_to_round2"] for o in outs)
    assert all(o["parameters"] == o["parameters_after"] for o in outs), "registered once"
    assert outs[0]["elastic"] == outs[1]["elastic"]
    assert outs[0]["elastic"] == outs[0]["torch"]


def _sync_then_rebuild() -> dict[str, Any]:
    rank = context.current().rank
    round2 = dist.new_group([0, 1])
    module = _net(seed=rank)
    model = DistributedDataParallel(module)
    optimizer = _sgd(model)
    state, spare = TorchState(model=model, optimizer=optimizer), ObjectState()
    _step(model, optimizer, 0, rank)
    state.commit()
    # Rank 1 alone gets one more commit in (its peer failed before committing it): it holds
    # the newest commit, rank 0 an older one.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0 + rank)
    (state if rank == 1 else spare).commit()
    newest = _digest(module)
    state.restore()
    activate_on_one_host(rank, 2, 2, round2)
    state.sync_if_needed(False)  # hvd.elastic.run's order: sync, then the training function
    model.eval()  # so that the forward leaves the buffers as they are
    model(torch.ones(3, 6))  # the round's first forward: the build broadcasts rank 0's state
    return {"newest": newest, "after_build": _digest(module)}


def test_the_rebuild_after_a_reform_keeps_the_newest_commit_that_the_sync_chose() -> None:
    """The sync comes first and takes the newest commit's holder (rank 1): the build's
    broadcast from rank 0 then carries that same state, never rank 0's older one."""
    outs = run_group(_sync_then_rebuild, 2)
    assert outs[0]["newest"] != outs[1]["newest"]
    assert outs[0]["after_build"] == outs[1]["after_build"] == outs[1]["newest"]


def _lose_a_peer(wrapper: type) -> Any:
    rank = context.current().rank
    model = wrapper(_net(seed=rank))
    loss = model(torch.ones(3, 6)).sum()
    if rank == 1:
        dist.destroy_process_group()  # its connections close, as a killed process's do
        return None
    time.sleep(0.5)
    try:
        loss.backward()
    except RuntimeError as err:
        return type(err).__name__
    return "no error"


@pytest.mark.parametrize(
    ("wrapper", "raised"),
    [(DistributedDataParallel, "WorkerLostError"), (TorchDDP, "RuntimeError")],
    ids=["elastic", "torch"],
)
def test_a_peer_lost_in_backward_raises_what_the_run_loop_handles(wrapper, raised) -> None:
    """hvd.elastic.run restores and re-joins on WorkerLostError only: with torch's DDP the
    survivor's backward raises a plain RuntimeError, which ends the worker."""
    assert run_group(_lose_a_peer, 2, wrapper)[0] == raised


# --- what it refuses, in one process ----------------------------------------------------------


@pytest.fixture
def one_rank() -> Iterator[context.WorkerContext]:
    """A 1-rank Gloo group as round 1's context (torch's DDP needs a group to be built)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield activate_on_one_host(0, 1, 1, dist.group.WORLD)
    finally:
        context.activate(None)
        dist.destroy_process_group()


def _refusal(build: Any) -> str:
    with pytest.raises(UnsupportedModelError) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_outside_init_it_says_init_comes_first() -> None:
    with pytest.raises(NotInitializedError, match=r"hvd.elastic.DistributedDataParallel needs"):
        DistributedDataParallel(_net(0))


def test_a_forward_after_shutdown_says_init_comes_first(one_rank) -> None:
    model = DistributedDataParallel(_net(0))
    context.activate(None)
    with pytest.raises(NotInitializedError, match=r"DistributedDataParallel \(forward\)"):
        model(torch.ones(2, 6))


def test_a_module_wrapped_already_is_refused(one_rank) -> None:
    net = _net(0)
    assert "torch DistributedDataParallel already; wrap its .module" in _refusal(
        lambda: DistributedDataParallel(TorchDDP(net))
    )
    assert "wrapped already" in _refusal(
        lambda: DistributedDataParallel(DistributedDataParallel(net))
    )
    assert "holds a torch DistributedDataParallel ('1')" in _refusal(
        lambda: DistributedDataParallel(nn.Sequential(nn.Linear(6, 6), TorchDDP(_net(1))))
    )


def test_a_module_on_another_device_than_the_worker_s_is_refused(one_rank) -> None:
    """The round's device here is the CPU; a module on the meta device stands for one on
    another GPU (the same check: the module's device against the worker's)."""
    assert "the module is on meta, but this worker (local rank 0) trains on cpu" in _refusal(
        lambda: DistributedDataParallel(_net(0).to("meta"))
    )
    split = _net(0)
    split[3].to("meta")
    assert "parameters and buffers are on cpu, meta: put them on one device" in _refusal(
        lambda: DistributedDataParallel(split)
    )
    assert "device_ids and output_device are for a module on a GPU" in _refusal(
        lambda: DistributedDataParallel(_net(0), device_ids=[0])
    )


def test_arguments_it_sets_itself_and_modules_without_gradients_are_refused(one_rank) -> None:
    assert "process_group= is not taken" in _refusal(
        lambda: DistributedDataParallel(_net(0), process_group=one_rank.group)
    )
    assert "mixed_precision= is not taken" in _refusal(
        lambda: DistributedDataParallel(_net(0), mixed_precision=None)
    )
    assert "bucket_size_mb= is no argument" in _refusal(
        lambda: DistributedDataParallel(_net(0), bucket_size_mb=1)
    )
    frozen = _net(0).requires_grad_(False)
    assert "no parameter that requires a gradient" in _refusal(
        lambda: DistributedDataParallel(frozen)
    )


def test_torch_state_refuses_a_plain_ddp_and_names_the_wrapper(one_rank) -> None:
    plain = TorchDDP(_net(0))
    wanted = "wrap the module with hvd.elastic.DistributedDataParallel(module, ...) instead"
    assert wanted in _refusal(lambda: TorchState(model=plain))
    state = TorchState(model=DistributedDataParallel(_net(0)))
    assert wanted in _refusal(lambda: setattr(state, "model", plain))
    assert "TorchState(model=...) holds" in _refusal(lambda: TorchState(model=plain))


def test_the_wrapper_commits_the_module_s_state_under_ddp_s_keys(one_rank) -> None:
    module = _net(0)
    model = DistributedDataParallel(module)
    assert list(model.state_dict()) == [f"module.{k}" for k in module.state_dict()]
    assert [id(p) for p in model.parameters()] == [id(p) for p in module.parameters()]
    model(torch.ones(3, 6))  # the inner DDP is no submodule: nothing is registered twice
    assert list(model.state_dict()) == [f"module.{k}" for k in module.state_dict()]


def test_a_copy_holds_no_ddp_and_builds_its_own(one_rank) -> None:
    model = DistributedDataParallel(_net(0))
    model(torch.ones(3, 6))
    twin = copy.deepcopy(model)
    assert twin._ddp is None
    assert torch.equal(twin(torch.ones(3, 6)), model(torch.ones(3, 6)))
    assert twin._ddp is not None and twin._ddp is not model._ddp


def test_horovod_style_scripts_load_none_of_it() -> None:
    code = (
        "import sys, elastic.torch as hvd; from elastic.state import TorchState; "
        "print(sorted(m for m in sys.modules if m.startswith('elastic.worker.training.ddp')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "['elastic.worker.training.ddp_checks']"
