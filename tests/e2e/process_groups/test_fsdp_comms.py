"""FSDP2's collectives as `ShardedState` routes them (`elastic.state.sharded.fsdp_comms`), in
real Gloo groups: the reduce-scatter a rank is blocked in gives up when the driver breaks the
round, and it reduces as Gloo's own does.

Gloo's own reduce-scatter could not give up: its wait ignores its timeout, so a survivor
blocked in it on a live peer that had gone on to the next round waited the whole collective
timeout, and the new round with it (the ~98M sharded benchmark after a SIGKILL).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from elastic.state.sharded.fsdp_comms import elastic_comms
from elastic.worker import context
from tests.support.peer_away import collective_while_a_peer_is_away
from tests.support.worker_group import run_group

HUNG_S = 4.0  # how long rank 1 stays away from the backward's reduce-scatter


def _model(mesh: Any) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    fully_shard(model, mesh=mesh, reshard_after_forward=False)  # backward: reduce-scatter only
    assert elastic_comms(model, "cpu") == 1
    return model


def _backward_while_a_peer_is_away() -> dict[str, Any]:
    ctx = context.current()
    model = _model(init_device_mesh("cpu", (2,)))
    loss = model(torch.ones(4, 64) * (ctx.rank + 1)).square().sum()
    return collective_while_a_peer_is_away(loss.backward, HUNG_S)


def test_a_rank_blocked_in_fsdp2_s_reduce_scatter_gives_up_when_the_round_is_broken() -> None:
    """Rank 1 stays away from the backward's reduce-scatter; the driver breaks the round
    0.3 s in: rank 0's backward raises WorkerLostError at once, not when rank 1 comes
    back (with Gloo's reduce-scatter it waited for rank 1: the whole collective timeout for
    a peer that had gone on to the next round)."""
    out = run_group(_backward_while_a_peer_is_away, 2)[0]
    assert "returned_after" not in out, f"backward waited {out.get('returned_after')} s"
    message, seconds = out["lost"]
    assert message == "round 1 is broken: rank 1 is hung"
    assert seconds < 2.0 < HUNG_S


def _reduce_both_ways(op_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    from elastic.state.sharded.fsdp_comms import _ReduceScatter

    rank, world = dist.get_rank(), dist.get_world_size()
    op = getattr(dist.ReduceOp, op_name)
    torch.manual_seed(rank)
    data = torch.randn(world * 5) * (rank + 1)
    ours, gloo = torch.empty(5), torch.empty(5)
    _ReduceScatter()(ours, data.clone(), dist.group.WORLD, op)
    work = dist.reduce_scatter_single(gloo, data.clone(), op=op, async_op=True)
    work.wait()
    return ours, gloo


@pytest.mark.parametrize("op_name", ["SUM", "AVG", "MAX", "MIN", "PRODUCT"])
def test_the_reduce_scatter_reduces_as_gloo_s_own_does(op_name: str) -> None:
    """Each rank gets its chunk reduced over the 3 ranks' inputs, as Gloo's reduce-scatter
    gives it (up to the order of the additions)."""
    for ours, gloo in run_group(_reduce_both_ways, 3, op_name):
        torch.testing.assert_close(ours, gloo)
