"""The worker's settings: the environment `elasticrun` sets (`WorkerEnvironment`) and the
durations the worker derives from it."""

from __future__ import annotations

from elastic.protocol.env import NotLaunchedError, WorkerEnvironment


class WorkerConfig(WorkerEnvironment):
    """`WorkerEnvironment`, read with `WorkerConfig.from_env()` (which raises
    `NotLaunchedError` outside `elasticrun`), plus how long the worker waits for what."""

    @property
    def rejoin_timeout(self) -> float:
        """How long a member waits for its next round: the driver may wait for joiners (to
        start, or to take this worker's state over) up to its elastic timeout."""
        return self.start_timeout + (self.elastic_timeout if self.elastic else 0.0)

    @property
    def driver_retry_for(self) -> float:
        """How long a call keeps retrying an unreachable driver: with etcd a restarted driver
        may take a while; without, the driver is gone for good."""
        return self.driver_wait if self.etcd is not None else self.start_timeout


__all__ = ["NotLaunchedError", "WorkerConfig"]
