"""What the next round looks like, when the first one starts and where to launch workers.
Pure functions, no I/O."""

from __future__ import annotations

import enum
from itertools import islice

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import UsageError


def next_members(
    survivors: list[str],
    joiners: list[str],
    max_np: int | None,
    handing_over: frozenset[str] = frozenset(),
) -> list[str]:
    """The next round's worker ids in rank order: surviving members keep their relative rank
    order (oldest first), ready joiners are appended in launch order, capped at `max_np`.

    Survivors in `handing_over` (leaving, but the only holders of the newest commit) stay
    members without counting against `max_np`: they leave once their state is passed on."""
    members, staying = [], 0
    for worker_id in survivors + [j for j in joiners if j not in survivors]:
        if worker_id in handing_over:
            members.append(worker_id)
        elif max_np is None or staying < max_np:
            members.append(worker_id)
            staying += 1
    return members


def free_slots(
    hosts: list[HostSpec], occupied: dict[str, set[int]], wanted: int
) -> list[tuple[str, int]]:
    """Up to `wanted` (hostname, slot index) pairs not in `occupied`, filling hosts in order.

    Walks no further than the `wanted`-th free slot: a host's slot count never becomes a list
    of that many places unless that many are wanted."""
    free = (
        (host.hostname, slot)
        for host in hosts
        for slot in range(host.slots)
        if slot not in occupied.get(host.hostname, set())
    )
    return list(islice(free, max(0, wanted)))


def first_places(
    hosts: list[HostSpec], np: int | None, max_np: int | None, elastic: bool
) -> list[tuple[str, int]]:
    """The first round's places on `hosts`, filling them in order.

    A static job takes `np` of them, and raises `UsageError` when there are fewer. An elastic
    job takes every slot offered, up to `max_np` (as Horovod Elastic does): `np` is how many
    it waited for (`start_check`), not a cap, so no offered slot stays idle."""
    if elastic:
        wanted = sum(h.slots for h in hosts) if max_np is None else max_np
    else:
        assert np is not None, "a static job has -np"
        wanted = np
    places = free_slots(hosts, {}, wanted)
    if not elastic and len(places) < wanted:
        raise UsageError(f"-np {wanted} is larger than the {len(places)} slot(s) available")
    return places


class Start(enum.Enum):
    """What an elastic job waiting for its first hosts does next (`start_check`)."""

    NOW = "now"  # launch the first round on the offered slots
    WAIT = "wait"  # ask discovery again
    FAIL = "fail"  # too few slots within --start-timeout: the job cannot start


def start_check(offered: int, wanted: int, needed: int, waited: float, timeout: float) -> Start:
    """Whether an elastic job starts on `offered` usable slots after `waited` seconds.

    It starts at once when `wanted` (-np; --min-np when -np is not given) are offered, as
    Horovod Elastic does. Past `timeout` (--start-timeout) it starts with what is offered
    if that is at least `needed` (--min-np), and grows as more slots are offered; with
    fewer it fails."""
    if offered >= wanted:
        return Start.NOW
    if waited < timeout:
        return Start.WAIT
    return Start.NOW if offered >= needed else Start.FAIL
