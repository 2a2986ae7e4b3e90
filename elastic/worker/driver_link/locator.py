"""Where the driver serves: from the environment at start, and, with the etcd backend, from
the address a restarted driver publishes in etcd, with the certificate it presents (TLS)."""

from __future__ import annotations

import logging
import threading
import time

from elastic.protocol.etcd import (
    AddressNotAuthentic,
    DriverAddress,
    EtcdOptions,
    connect,
    login_expired,
    refusal,
)

log = logging.getLogger(__name__)

LOOKUP_EVERY = 0.25  # seconds between etcd lookups while the driver is unreachable, at most


class DriverLocator:
    """The driver's HTTP URL, control address and (TLS) certificate. Thread-safe.

    `refresh()` is called by clients that cannot reach the driver: without etcd it changes
    nothing; with etcd it reads the job's `driver` key (at most every `LOOKUP_EVERY` s).
    Each client then compares the addresses and certificate with the ones it uses. etcd
    errors change nothing: the caller retries (a login etcd forgot is made again at the next
    lookup; a refusal, such as a user without read access, is logged once).

    A restarted driver publishes its addresses (and, with TLS, its new certificate) with a MAC
    under the job token. A document is taken up only when its MAC verifies with `token`;
    one that does not is refused as a whole and logged once: someone other than the job's
    driver wrote it, and moving there would hand that server the token. Without `token`
    nothing published is taken up.
    """

    def __init__(
        self,
        url: str,
        control_address: str,
        etcd: EtcdOptions | None,
        job_id: str,
        *,
        token: str | None = None,
        tls_cert: bytes | None = None,
    ) -> None:
        self._url = url
        self._control_address = control_address
        self._etcd = etcd
        self._job_id = job_id
        self._key = etcd.job_key(job_id, "driver") if etcd is not None else ""
        self._token = token
        self._tls_cert = tls_cert
        self._client = None
        self._lock = threading.Lock()
        self._last_lookup = 0.0
        self._refused: bytes | None = None  # the last document refused
        self._refusal = ""  # the last refusal by etcd itself, as logged

    @property
    def url(self) -> str:
        with self._lock:
            return self._url

    @property
    def control_address(self) -> str:
        with self._lock:
            return self._control_address

    @property
    def tls_cert(self) -> bytes | None:
        """The certificate (PEM) the driver presents, as given or last published and verified."""
        with self._lock:
            return self._tls_cert

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
                self._failed(err)
                return
            if value is None:
                return  # no driver runs the job right now
            try:
                address = DriverAddress.model_validate_json(value)
                address.verified(self._token or "", self._job_id)
            except AddressNotAuthentic as err:
                if value != self._refused:  # once per forged document, not every lookup
                    log.error("refusing the driver address found in etcd: %s", err)
                    self._refused = value
                return
            except ValueError as err:
                log.debug("unreadable driver address in etcd: %s", err)
                return
            if address.url != self._url:
                log.warning("the driver now serves at %s", address.url)
            self._url, self._control_address = address.url, address.control_address
            if address.cert_pem is not None:
                self._tls_cert = address.cert_pem

    def _failed(self, err: Exception) -> None:
        """A lookup failed: drop a client whose login etcd forgot; say a refusal once."""
        assert self._etcd is not None
        if login_expired(err) and self._client is not None:
            self._client.close()
            self._client = None
        refused = refusal(err, self._etcd)
        if refused is not None and str(refused) != self._refusal:
            self._refusal = str(refused)
            log.error("cannot look the driver up in etcd: %s", refused)
        else:
            log.debug("cannot look the driver up in etcd: %s", err)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
