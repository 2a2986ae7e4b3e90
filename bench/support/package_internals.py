"""The package's private names that benchmarks reuse, named here and nowhere else in bench/.

A benchmark that stands in for a worker or for the driver's control service must behave as
they do on the wire: the same gRPC channel options, the same status codes retried, the same
server options and token check. The package keeps these private; each function below imports
one lazily (a simulated worker's process must not pay for the driver's imports) and is the
only place that names it. Once the package exports them, each body becomes a plain import.
"""

from __future__ import annotations

from typing import Any


def worker_channel_options() -> list[tuple[str, Any]]:
    """The gRPC channel options of a worker's control client (keep-alive, reconnect backoff)."""
    from elastic.worker.driver_link.control_client import _CHANNEL_OPTIONS

    return list(_CHANNEL_OPTIONS)


def worker_retryable_codes() -> frozenset[Any]:
    """The gRPC status codes a worker's control client retries (`grpc.StatusCode`s)."""
    from elastic.worker.driver_link.control_client import _RETRYABLE

    return frozenset(_RETRYABLE)


def control_server_options() -> list[tuple[str, Any]]:
    """The gRPC server options of the driver's control service (message size, keep-alive)."""
    from elastic.driver.control.server import _SERVER_OPTIONS

    return list(_SERVER_OPTIONS)


def control_token_check(token: str) -> Any:
    """The control service's interceptor (a `grpc.aio.ServerInterceptor`) that refuses every
    call without `authorization: Bearer <token>`."""
    from elastic.driver.control.server import _TokenCheck

    return _TokenCheck(token)
