"""Horovod's `hvd.reducescatter` in a real Gloo group: a rank blocked in it on a peer that
stays away gives up when the driver breaks the round. Over Gloo's own reduce-scatter it
could not: its wait ignores its timeout, so a survivor blocked there on a live peer that had
gone on to the next round waited the whole collective timeout, and the new round with it
(found in FSDP2's reduce-scatter by the ~98M sharded benchmark; see test_fsdp_comms.py)."""

from __future__ import annotations

from typing import Any

import torch

import elastic.torch as hvd
from elastic.worker import context
from tests.support.peer_away import collective_while_a_peer_is_away
from tests.support.worker_group import run_group

HUNG_S = 4.0  # how long rank 1 stays away from the reducescatter


def _reducescatter(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The reduce-scatter `hvd.reducescatter` runs once the ranks agreed on its arguments
    (called directly: the agreement is an allgather that a peer staying away would hold
    first)."""
    from elastic.worker.collectives.handles import complete
    from elastic.worker.collectives.process_sets import global_process_set, scope
    from elastic.worker.collectives.reducescatters import _start_reducescatter

    where = scope(context.current(), global_process_set, "test")
    return complete(_start_reducescatter(where, [tensor], hvd.Sum, 1.0, 1.0))


def _reducescatter_while_a_peer_is_away() -> dict[str, Any]:
    tensor = torch.arange(6 * 1000, dtype=torch.float32).reshape(6, 1000)
    return collective_while_a_peer_is_away(lambda: _reducescatter(tensor)[0], HUNG_S)


def test_a_rank_blocked_in_reducescatter_gives_up_when_the_round_is_broken() -> None:
    out, late = run_group(_reducescatter_while_a_peer_is_away, 2, timeout=60)
    rows = torch.arange(6 * 1000, dtype=torch.float32).reshape(6, 1000)[3:]
    assert torch.equal(late["result"], 2 * rows), "the late rank's rows: both ranks' sum"
    assert "returned_after" not in out, f"reducescatter waited {out.get('returned_after')} s"
    message, seconds = out["lost"]
    assert "round 1 is broken: rank 1 is hung" in message
    assert seconds < 2.0 < HUNG_S
