"""Where the driver serves: from the environment at start, and, with the etcd backend, from
the address a restarted driver publishes in etcd."""

from __future__ import annotations

import logging
import threading
import time

from elastic.protocol.etcd import DriverAddress, EtcdOptions, connect

log = logging.getLogger(__name__)

LOOKUP_EVERY = 0.25  # seconds between etcd lookups while the driver is unreachable, at most


class DriverLocator:
    """The driver's HTTP URL and control address. Thread-safe.

    `refresh()` is called by clients that cannot reach the driver: without etcd it changes
    nothing; with etcd it reads the job's `driver` key (at most every `LOOKUP_EVERY` s).
    Each client then compares the addresses with the ones it uses. etcd errors change
    nothing: the caller retries.
    """

    def __init__(
        self, url: str, control_address: str, etcd: EtcdOptions | None, job_id: str
    ) -> None:
        self._url = url
        self._control_address = control_address
        self._etcd = etcd
        self._key = etcd.job_key(job_id, "driver") if etcd is not None else ""
        self._client = None
        self._lock = threading.Lock()
        self._last_lookup = 0.0

    @property
    def url(self) -> str:
        with self._lock:
            return self._url

    @property
    def control_address(self) -> str:
        with self._lock:
            return self._control_address

    def refresh(self) -> None:
        """Look the driver up in etcd (unless done less than `LOOKUP_EVERY` s ago)."""
        if self._etcd is None:
            return
        with self._lock:
            if time.monotonic() - self._last_lookup < LOOKUP_EVERY:
                return
            self._last_lookup = time.monotonic()
            try:
                if self._client is None:
                    self._client = connect(self._etcd)
                value, _ = self._client.get(self._key)
            except Exception as err:  # etcd down too: the caller keeps retrying
                log.debug("cannot look the driver up in etcd: %s", err)
                return
            if value is None:
                return  # no driver runs the job right now
            address = DriverAddress.model_validate_json(value)
            if address.url != self._url:
                log.warning("the driver now serves at %s", address.url)
            self._url, self._control_address = address.url, address.control_address

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
