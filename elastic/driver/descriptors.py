"""The driver's open files: how many connections each of its listening ports may hold.

The driver holds one descriptor per connection on each of its three ports (the HTTP API, the
gRPC control service, the heartbeat port) and more for its own work: workers' pipes and log
files, ssh sessions, discovery scripts, etcd. A port allowed to hold as many connections as
the open-file limit lets strangers on the network take the descriptors the driver needs to
start a worker or open a log. So, at start, the driver raises its soft limit toward the hard
one (`raise_open_file_limit`), keeps a reserve for its own work, and gives each port a share of
the rest (`descriptor_budget`): all ports full together never take the reserve.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

WANTED_OPEN_FILES = 65_536
"""The soft limit the driver asks for at start (the hard limit, where that is lower): every
port's largest share below plus a reserve of an eighth."""

HTTP_CONNECTIONS = 8_192
"""The HTTP port's share, at most: a worker holds one HTTP connection, or a few while torch
calls its Store from several threads, and drops it after 5 s idle."""

GRPC_CONNECTIONS = 16_384
"""The gRPC port's share, at most: a worker holds one connection (its control channel)."""

BEAT_CONNECTIONS = 16_384
"""The heartbeat port's share, at most: a worker holds one connection."""

MIN_RESERVE = 256
"""Descriptors kept for the driver's own work, at least; an eighth of the limit where that is
more."""


@dataclass(frozen=True)
class DescriptorBudget:
    """Connections each port may hold (`http`, `grpc`, `beats`) and the descriptors kept for
    the driver's own work (`reserve`), out of an open-file limit of `limit` (None: none)."""

    limit: int | None
    reserve: int
    http: int
    grpc: int
    beats: int


def descriptor_budget(limit: int | None = None) -> DescriptorBudget:
    """Each port's share of the open-file limit `limit` (default: this process's soft limit
    now). The reserve is an eighth of the limit, at least `MIN_RESERVE`; the rest is shared in
    proportion to the ports' largest shares (`HTTP_CONNECTIONS`, `GRPC_CONNECTIONS`,
    `BEAT_CONNECTIONS`: 2:4:4) and no port gets more than its largest. Every share is at least
    1, so below about 260 open files the ports together may reach into the reserve."""
    if limit is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = None if soft == resource.RLIM_INFINITY else soft
    largest = (HTTP_CONNECTIONS, GRPC_CONNECTIONS, BEAT_CONNECTIONS)
    if limit is None:
        return DescriptorBudget(None, 0, *largest)
    reserve = max(MIN_RESERVE, limit // 8)
    usable = max(0, limit - reserve)
    total = sum(largest)
    http, grpc, beats = (max(1, min(most, most * usable // total)) for most in largest)
    return DescriptorBudget(limit, reserve, http, grpc, beats)


def raise_open_file_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raise this process's soft open-file limit to `wanted`, or to the hard limit where that
    is lower; never lower it. Returns the soft limit now. Logs one warning when the limit
    cannot be changed (the ports' shares then come out of the limit as it is)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, err)
    return soft
