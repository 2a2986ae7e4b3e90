"""How the control service answers a worker's report it cannot take, on gRPC and on the
heartbeat port alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

MAX_ID_LENGTH = 256


def check_id(worker_id: str) -> str | None:
    """What is wrong with `worker_id` as a worker's id, or None."""
    if not worker_id:
        return "worker_id is empty"
    if len(worker_id) > MAX_ID_LENGTH:
        return f"worker_id is longer than {MAX_ID_LENGTH} characters"
    return None


def refusal(
    worker_id: str, report: Callable[..., bool], *args: Any
) -> tuple[grpc.StatusCode, str] | None:
    """Validate `worker_id` and run `report(*args)`: None when it answers True, else the code
    to end the call with: NOT_FOUND when it answers False, UNAVAILABLE (retryable, like the
    HTTP API's 503) when it raises, INVALID_ARGUMENT for a bad id (`report` is not run)."""
    if problem := check_id(worker_id):
        return grpc.StatusCode.INVALID_ARGUMENT, problem
    try:
        known = report(*args)
    except Exception as err:
        log.exception("driver error serving a control call of worker %s", worker_id)
        return grpc.StatusCode.UNAVAILABLE, f"driver error: {type(err).__name__}"
    if not known:
        return grpc.StatusCode.NOT_FOUND, f"no live worker {worker_id!r}"
    return None
