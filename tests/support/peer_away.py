"""A collective one rank of two enters while the other stays away: what a survivor blocked on
a live peer that went on to the next round sees. Run in `run_group` processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from elastic.worker import context
from elastic.worker.errors import WorkerLostError


def collective_while_a_peer_is_away(
    collective: Callable[[], Any], away_s: float, break_after_s: float = 0.3
) -> dict[str, Any]:
    """Rank 0 calls `collective()` while rank 1 stays away for `away_s` seconds; the driver's
    word that the round is broken ("rank 1 is hung") reaches rank 0 `break_after_s` in.
    Rank 0 returns `{"lost": (message, seconds)}` when the collective raised
    `WorkerLostError`, else `{"returned_after": seconds}`; rank 1 then calls `collective()`
    too (so that rank 0's abandoned transfer ends) and returns `{"result": ...}`. Neither
    rank leaves before the other."""
    ctx = context.current()
    side = dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    if ctx.rank == 0:
        timer = threading.Timer(
            break_after_s, ctx.events.break_round, (ctx.round, "rank 1 is hung")
        )
        timer.start()
        started = time.monotonic()
        try:
            collective()
            out["returned_after"] = time.monotonic() - started
        except WorkerLostError as err:
            out["lost"] = (str(err), time.monotonic() - started)
        timer.cancel()
    else:
        time.sleep(away_s)
        out["result"] = collective()
    dist.barrier(group=side)
    return out
