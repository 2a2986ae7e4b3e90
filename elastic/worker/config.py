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
    control_address: str
    token: str
    worker_id: str
    hostname: str
    elastic: bool
    start_timeout: float
    collective_timeout: float

    @classmethod
    def from_env(cls) -> WorkerConfig:
        required = (env.DRIVER_URL, env.CONTROL_ADDRESS, env.TOKEN, env.WORKER_ID, env.HOSTNAME)
        missing = [name for name in required if not os.environ.get(name)]
        if missing:
            raise NotLaunchedError(
                "elastic.torch.init(): this process was not started by elasticrun "
                f"({', '.join(missing)} not set); run it as `elasticrun -np N python script.py`"
            )
        return cls(
            driver_url=os.environ[env.DRIVER_URL],
            control_address=os.environ[env.CONTROL_ADDRESS],
            token=os.environ[env.TOKEN],
            worker_id=os.environ[env.WORKER_ID],
            hostname=os.environ[env.HOSTNAME],
            elastic=os.environ.get(env.ELASTIC) == "1",
            start_timeout=float(os.environ.get(env.START_TIMEOUT, "30")),
            collective_timeout=float(os.environ.get(env.COLLECTIVE_TIMEOUT, "1800")),
        )
