"""`create_round_subgroup`: a group beside the round's own (the sharded state's replication
and checkpoint groups), whose connections wait the connect timeout, not the collective one.

In-process, with `dist.new_group` replaced by what a real sharded soak run met (seed 830275):
Gloo's RuntimeError when a peer died while the ranks connected, and the driver store's
`RoundSuperseded` when a newer round formed. Where the driver broke the round (every member's
collectives fail) the failure is a lost peer, `WorkerLostError`; where it did not (a round
superseded by a leave: seed 959202, whose other ranks then waited in the round's next
collective), the error goes on and the worker exits, so that the driver breaks the round.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic.worker.driver_link.http_client import RoundSuperseded
from elastic.worker.errors import WorkerLostError
from elastic.worker.group import process_group

ERRORS = [
    RuntimeError("Gloo connectFullMesh failed with [...] Connection refused\nmore"),
    RoundSuperseded("round 1 was superseded by round 3"),
    TimeoutError(),
]


def failing(monkeypatch, error: Exception) -> None:
    def new_group(**kwargs: object) -> None:
        raise error

    monkeypatch.setattr(dist, "new_group", new_group)


@pytest.mark.parametrize("error", ERRORS)
def test_a_failed_forming_in_a_broken_round_is_a_lost_peer(monkeypatch, error) -> None:
    failing(monkeypatch, error)
    with pytest.raises(WorkerLostError, match="forming a group of the round's ranks: rank 2 died"):
        process_group.create_round_subgroup(timedelta(seconds=60), lambda: "rank 2 died")


@pytest.mark.parametrize("error", ERRORS)
def test_a_failed_forming_in_a_round_not_broken_goes_on(monkeypatch, error) -> None:
    failing(monkeypatch, error)
    with pytest.raises(type(error)) as info:
        process_group.create_round_subgroup(timedelta(seconds=60), lambda: None)
    assert info.value is error


def test_connections_wait_the_connect_timeout_and_collectives_the_round_s(monkeypatch) -> None:
    seen: dict[str, object] = {}
    group = object()

    def new_group(**kwargs: object) -> object:
        seen.update(kwargs)
        return group

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(
        process_group, "set_group_timeout", lambda t, g: seen.update(collectives=(t, g))
    )
    made = process_group.create_round_subgroup(timedelta(seconds=60), lambda: None)
    assert made is group
    assert seen["backend"] == "gloo"
    assert seen["timeout"] == process_group.CONNECT_TIMEOUT
    assert seen["collectives"] == (timedelta(seconds=60), group)
