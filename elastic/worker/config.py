"""The worker's settings, read from the environment `elasticrun` sets."""

from __future__ import annotations

import os
from dataclasses import dataclass

from elastic.errors import ElasticError
from elastic.protocol import env
from elastic.protocol.etcd import EtcdOptions, parse_endpoints


class NotLaunchedError(ElasticError, RuntimeError):
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
    job_id: str = ""
    tls_cert: bytes | None = None  # the driver's certificate, pinned (TLS)
    etcd: EtcdOptions | None = None  # where a restarted driver publishes its address
    driver_wait: float = 300.0  # seconds to keep trying to reach a restarted driver
    elastic_timeout: float = 600.0  # seconds the driver may wait for enough workers

    @property
    def rejoin_timeout(self) -> float:
        """How long a member waits for its next epoch: the driver may wait for joiners (to
        start, or to take this worker's state over) up to its elastic timeout."""
        return self.start_timeout + (self.elastic_timeout if self.elastic else 0.0)

    @property
    def driver_retry_for(self) -> float:
        """How long a call keeps retrying an unreachable driver: with etcd a restarted driver
        may take a while; without, the driver is gone for good."""
        return self.driver_wait if self.etcd is not None else self.start_timeout

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
            job_id=os.environ.get(env.JOB_ID, ""),
            tls_cert=os.environ[env.TLS_CERT].encode() if os.environ.get(env.TLS_CERT) else None,
            etcd=_etcd_from_env(),
            driver_wait=float(os.environ.get(env.DRIVER_WAIT, "300")),
            elastic_timeout=float(os.environ.get(env.ELASTIC_TIMEOUT, "600")),
        )


def _etcd_from_env() -> EtcdOptions | None:
    endpoints = os.environ.get(env.ETCD_ENDPOINTS)
    if not endpoints:
        return None
    return EtcdOptions(
        endpoints=parse_endpoints(endpoints),
        prefix=os.environ.get(env.ETCD_PREFIX, "/elasticrun"),
        ca_cert=os.environ.get(env.ETCD_CA_CERT),
        cert=os.environ.get(env.ETCD_CERT),
        key=os.environ.get(env.ETCD_KEY),
        user=os.environ.get(env.ETCD_USER),
        password=os.environ.get(env.ETCD_PASSWORD),
    )
