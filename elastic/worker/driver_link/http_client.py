"""The worker's HTTP client for the driver's API, with bounded retries on every call."""

from __future__ import annotations

import os
import time
from typing import TypeVar

import httpx
from pydantic import BaseModel

from elastic.errors import ElasticError
from elastic.protocol.http import JoinRequest, JoinResponse
from elastic.worker.config import WorkerConfig
from elastic.worker.driver_link.locator import DriverLocator
from elastic.worker.driver_link.retries import bounded_retries
from elastic.worker.driver_link.transport import http_client

Response = TypeVar("Response", bound=BaseModel)


class DriverError(ElasticError, RuntimeError):
    """The driver refused a request (4xx) or stayed unreachable past the retry budget."""


class KeyNotFound(DriverError):
    """A `get` found no value within its timeout (HTTP 404)."""


class RoundSuperseded(DriverError):
    """A newer round formed while waiting on this one's keys (HTTP 410): re-join."""


class NotMemberError(DriverError):
    """The driver excluded this worker from the job: it must leave."""


def _retryable(err: BaseException) -> bool:
    if isinstance(err, httpx.TransportError):
        return True
    return isinstance(err, httpx.HTTPStatusError) and err.response.status_code >= 500


class DriverClient:
    """Calls the driver; transport errors and 5xx are retried for up to `retry_for` seconds.

    A 4xx answer is not retried: it raises `DriverError` with the driver's message
    (`KeyNotFound` for 404). Thread-safe: torch may call the Store from its own threads.
    While the driver is unreachable, `locator` is asked where it went (a restarted driver
    publishes its new address in etcd). With `tls_cert`, the driver must present it, or
    the certificate a restarted driver published and the locator verified.
    """

    def __init__(
        self,
        url: str,
        token: str,
        retry_for: float = 60.0,
        *,
        tls_cert: bytes | None = None,
        locator: DriverLocator | None = None,
    ) -> None:
        self._http = http_client(url, token, tls_cert, httpx.Timeout(10.0))
        self._url = url
        self._token, self._tls_cert = token, tls_cert
        self._retry_for = retry_for
        self._locator = locator

    @classmethod
    def for_worker(cls, config: WorkerConfig) -> DriverClient:
        """A client of the driver `config` names (a worker's, a standby's), following it
        where a restarted one publishes its address (etcd), retrying for as long as the
        worker would; `locator` is there for the worker's other links."""
        locator = DriverLocator(
            config.driver_url,
            config.control_address,
            config.etcd,
            config.job_id,
            token=config.token,  # verifies the certificate a restarted driver publishes (TLS)
            tls_cert=config.tls_cert,
        )
        return cls(
            config.driver_url,
            config.token,
            retry_for=config.driver_retry_for,
            tls_cert=config.tls_cert,
            locator=locator,
        )

    @property
    def locator(self) -> DriverLocator | None:
        """Where this client looks for a driver that moved."""
        return self._locator

    def _relocate(self) -> bool:
        """Between retries: follow the driver if it moved; True if it did."""
        if self._locator is None:
            return False
        self._locator.refresh()
        url, cert = self._locator.url, self._locator.tls_cert or self._tls_cert
        if url == self._url and cert == self._tls_cert:
            return False
        if cert != self._tls_cert:  # a restarted driver's new certificate (MAC verified)
            # A new client: one in use by another thread is left to finish, not closed.
            self._http = http_client(url, self._token, cert, httpx.Timeout(10.0))
            self._tls_cert = cert
        self._url = self._http.base_url = url
        return True

    def close(self) -> None:
        self._http.close()

    def post(
        self, path: str, body: BaseModel, response: type[Response], wait: float = 0.0
    ) -> Response:
        """POST `body` and parse the answer; `wait` is how long the server may hold the call."""
        retrying = bounded_retries(self._retry_for, _retryable, moved=self._relocate)
        try:
            for attempt in retrying:
                with attempt:
                    answer = self._http.post(
                        path,
                        content=body.model_dump_json(),
                        headers={"Content-Type": "application/json"},
                        timeout=httpx.Timeout(10.0, read=wait + 10.0),
                    )
                    if answer.status_code >= 500:
                        answer.raise_for_status()
        except httpx.HTTPError as err:
            raise DriverError(
                f"driver at {self._http.base_url} unreachable for {self._retry_for:g} s: {err}"
            ) from err
        if answer.status_code == 404:
            raise KeyNotFound(answer.json().get("detail", "not found"))
        if answer.status_code == 410:
            raise RoundSuperseded(answer.json().get("detail", "round superseded"))
        if answer.status_code >= 400:
            raise DriverError(f"driver refused {path}: {answer.status_code} {answer.text}")
        return response.model_validate_json(answer.content)

    def join(
        self, worker_id: str, after_round: int, timeout: float, commit: int = 0
    ) -> JoinResponse:
        """Join the first round newer than `after_round` that includes this worker, telling
        the driver how many commits its state holds (`commit`).

        Returns the driver's `formed` answer (its `epoch` is the round; the slot; the job's
        newest commit). Raises
        `NotMemberError` if the driver excluded the worker (it must leave the job),
        `DriverError` if no such round forms within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            poll = max(0.0, min(30.0, deadline - time.monotonic()))
            request = JoinRequest(
                worker_id=worker_id,
                after_epoch=after_round,  # the wire's old name for a round
                pid=os.getpid(),
                timeout=poll,
                commit=commit,
            )
            answer = self.post("/v1/rendezvous/join", request, JoinResponse, wait=poll)
            if answer.status == "not_member":
                raise NotMemberError(f"worker {worker_id} is no longer part of the job")
            if answer.status == "formed" and answer.slot is not None:
                return answer
            if time.monotonic() >= deadline:
                raise DriverError(
                    f"no round after {after_round} with worker {worker_id} formed within "
                    f"{timeout:g} s"
                )
