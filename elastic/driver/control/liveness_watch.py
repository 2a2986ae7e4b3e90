"""The periodic look at every live worker's heartbeats, stream and start (`judge`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from elastic.driver.policy.liveness import Limits, judge
from elastic.driver.reports import Judged, Reports, Tick
from elastic.driver.workers import Worker

log = logging.getLogger("elasticrun")

PAUSE_WORTH_SAYING = 1.0  # seconds: a shorter pause (a loaded machine) is excused silently
LAG_WORTH_CREDITING = 0.01  # seconds a look may be late before the lateness is credited


class LivenessWatch:
    """Every `min(heartbeat interval, 0.25 s)`, reports each verdict of `judge` over the live
    workers (`live()`) and then a `Tick`; tells `on_lag` how late each look woke.

    Misses are judged against heartbeats this driver had the time to read:
    * a look that wakes late by at least a heartbeat interval means this driver was paused
      (its loop blocked, its process stopped) and heard nothing meanwhile: missed heartbeats
      count from then again, so that the silence it caused does not make every worker hung;
    * a look that wakes late by less (a loop busy with thousands of workers' calls, whose
      heartbeats wait unread on the heartbeat port meanwhile) credits every worker with that
      lateness;
    * a worker that registered with this driver and none of whose heartbeats has reached it
      yet (its heartbeat connection waits in the port's backlog, or its event stream, which
      names the port, in gRPC's queue) is excused for up to the start timeout after it
      registered: its missed heartbeats count from then (HUNG 3 intervals later), so a
      worker stopped between its registration and its first heartbeat is found. Its process
      exit or closed event stream still count meanwhile, and it is NOT_JOINED after the start
      timeout if it never joins.

    Why the start timeout bounds that excuse: it is the user's allowance for a worker to start
    (register, open its stream, beat, join), which a large job sets to match its size; the
    delay it excuses grows with the job (the driver opens every stream of 10,000 workers in
    about 17 s, docs/benchmarks.md), which a number of heartbeat intervals would have to guess.
    Unbounded, a worker stopped right after registering and then given a slot (an HTTP join)
    was excused forever and its round waited for it forever.
    """

    def __init__(
        self,
        live: Callable[[], Iterable[Worker]],
        limits: Limits,
        reports: Reports,
        clock: Callable[[], float],
        on_lag: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._live = live
        self._on_lag = on_lag
        self._limits = limits
        self._reports = reports
        self._clock = clock

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        every = min(self._limits.heartbeat_interval, 0.25)
        while True:
            due = loop.time() + every
            await asyncio.sleep(every)
            now = self._clock()
            workers = list(self._live())  # one pass builds it: it is every live worker
            lag = loop.time() - due
            self._on_lag(max(lag, 0.0))
            self._excuse_lag(lag, now, workers)
            for worker, verdict in judge(workers, now, self._limits):
                self._reports.put_nowait(Judged(worker, verdict))
            self._reports.put_nowait(Tick(now))

    def _excuse_lag(self, late: float, now: float, workers: list[Worker]) -> None:
        excused_for = self._limits.start_timeout
        for worker in workers:  # not heard yet: its silence is not its own, for a while
            if worker.registered and not worker.heard and worker.registered_at is not None:
                until = min(now, worker.registered_at + excused_for)
                worker.last_heartbeat = max(worker.last_heartbeat, until)
        if late < LAG_WORTH_CREDITING:
            return
        if late < self._limits.heartbeat_interval:
            for worker in workers:
                worker.last_heartbeat = min(worker.last_heartbeat + late, now)
            return
        if late >= PAUSE_WORTH_SAYING:
            log.warning(
                "this driver was paused for %.1f s (its event loop blocked, or its process "
                "stopped): workers' heartbeats are awaited from now",
                late,
            )
        for worker in workers:
            worker.last_heartbeat = max(worker.last_heartbeat, now)
