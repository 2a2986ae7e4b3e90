"""The environment a worker process starts with: the driver's, plus `WorkerEnvironment`."""

from __future__ import annotations

import os

from elastic.driver.server.endpoints import Endpoints
from elastic.driver.settings import Settings
from elastic.protocol.env import WorkerEnvironment
from elastic.protocol.http import SlotInfo


def worker_environment(
    settings: Settings,
    endpoints: Endpoints,
    *,
    job_id: str,
    token: str,
    worker_id: str,
    hostname: str,
    slot: SlotInfo | None,
) -> dict[str, str]:
    """The variables of worker `worker_id` on `hostname`; `slot`: its place in the first
    round when that is formed already (the job's first workers), else None."""
    elastic = settings.elastic
    environment = WorkerEnvironment(
        driver_url=endpoints.url,
        control_address=endpoints.control_address,
        token=token,
        worker_id=worker_id,
        hostname=hostname,
        job_id=job_id,
        elastic=elastic is not None,
        start_timeout=settings.start_timeout,
        collective_timeout=settings.collective_timeout,
        **({"elastic_timeout": elastic.elastic_timeout} if elastic else {}),
        tls_cert=endpoints.tls.cert_pem if endpoints.tls else None,
        etcd=settings.backend.etcd,  # workers find a restarted driver through etcd
        driver_wait=settings.backend.driver_wait,
        slot=slot,
    )
    return {
        **os.environ,
        **environment.to_env(),
        "PYTHONUNBUFFERED": "1",
        "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR"),
    }
