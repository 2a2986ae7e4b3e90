"""The worker's settings, read from the environment `elasticrun` sets."""

from __future__ import annotations

import os
from dataclasses import dataclass

from elastic.protocol import env


class NotLaunchedError(RuntimeError):
    """The process was not started by `elasticrun`: the driver's address or token is missing."""


@dataclass(frozen=True)
class WorkerConfig:
    driver_url: str
    token: str
    hostname: str
    local_rank: int
    start_timeout: float
    collective_timeout: float

    @classmethod
    def from_env(cls) -> WorkerConfig:
        missing = [
            name
            for name in (env.DRIVER_URL, env.TOKEN, env.HOSTNAME, env.LOCAL_RANK)
            if not os.environ.get(name)
        ]
        if missing:
            raise NotLaunchedError(
                "elastic.torch.init(): this process was not started by elasticrun "
                f"({', '.join(missing)} not set); run it as `elasticrun -np N python script.py`"
            )
        return cls(
            driver_url=os.environ[env.DRIVER_URL],
            token=os.environ[env.TOKEN],
            hostname=os.environ[env.HOSTNAME],
            local_rank=int(os.environ[env.LOCAL_RANK]),
            start_timeout=float(os.environ.get(env.START_TIMEOUT, "30")),
            collective_timeout=float(os.environ.get(env.COLLECTIVE_TIMEOUT, "1800")),
        )
