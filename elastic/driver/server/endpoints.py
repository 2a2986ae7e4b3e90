"""The driver's two endpoints, the HTTP API and the gRPC control service, with one TLS identity."""

from __future__ import annotations

import logging
import os

from elastic.driver.control.events import Placement, WorkerListener
from elastic.driver.control.server import ControlServer
from elastic.driver.logs import tags, terminal_handlers
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.login_codes import login_url
from elastic.driver.server.services import Services
from elastic.driver.server.sessions import PageSessions, cookie_name
from elastic.driver.server.tls import TlsIdentity
from elastic.driver.settings import Settings
from elastic.protocol.etcd import DriverAddress
from elastic.protocol.http import SlotInfo

log = logging.getLogger("elasticrun")


def tls_identity(settings: Settings, address: str) -> TlsIdentity | None:
    """The certificate to serve with: the user's, a new self-signed one, or none."""
    if not settings.tls:
        return None
    if settings.tls_cert is not None and settings.tls_key is not None:
        return TlsIdentity.load(settings.tls_cert, settings.tls_key)
    return TlsIdentity.make_self_signed(sorted({address, "127.0.0.1", "localhost"}))


def _placement(services: Services) -> Placement:
    """Slots for the event stream, answered as `/v1/rendezvous/join` would answer them."""
    rendezvous = services.rendezvous

    async def placement(worker_id: str, number: int) -> tuple[SlotInfo, int] | None:
        if rendezvous.round != number or (slot := rendezvous.slot_of(worker_id)) is None:
            return None
        if services.durable is not None:
            await services.durable()
            if rendezvous.round != number:
                return None
        return slot, services.newest_commit()

    return placement


class Endpoints:
    """The HTTP API and the control service on `address` (free ports), started together."""

    def __init__(
        self,
        settings: Settings,
        address: str,
        services: Services,
        listener: WorkerListener,
    ) -> None:
        self.tls = tls_identity(settings, address)
        self.sessions = PageSessions()
        app = create_app(services, sessions=self.sessions)
        self._http = HttpServer(app, address, tls=self.tls, allowed_hosts=settings.allowed_hosts)
        self.sessions.cookie = cookie_name(self._http.port)  # bound: one cookie per driver
        self._control = ControlServer(
            listener,
            services.token,
            address,
            heartbeat_interval=settings.heartbeat_interval,
            tls=self.tls,
            placement=_placement(services),
        )
        self.url = ""
        self.control_address = ""

    async def start(self) -> None:
        """Bind and serve both; raises RuntimeError when an address cannot be bound."""
        await self._http.start()
        await self._control.start()
        self.url, self.control_address = self._http.url, self._control.address
        log.debug("HTTP API on %s, control on %s", self.url, self.control_address)

    def announce_page(self, job_id: str) -> None:
        """Show the person at the launcher's terminal a one-time login link to the page
        (never the token): one line, in the launcher's format, to the log handlers that write
        to a terminal only, never to a file, a pipe, or the log tail of `/v1/status` and the
        page, where the link is a credential others read. Without a terminal no link is made;
        one line (logged as usual) says how to get one: `elasticrun status --login`."""
        terminals = terminal_handlers(log, logging.INFO)
        if not terminals:
            log.info(
                "dashboard: no login link is printed where the output is not a terminal; get "
                "one with `elasticrun status --login --job-id %s` on this host",
                job_id,
                extra=tags("dashboard"),
            )
            return
        minutes = self.sessions.limits.code_lifetime / 60
        line = log.makeRecord(
            log.name,
            logging.INFO,
            __file__,
            0,
            "dashboard: %s (a one-time login link, for %g minutes)",
            (self.login_url(), minutes),
            None,
            extra=tags("dashboard"),
        )
        for handler in terminals:
            handler.handle(line)

    def login_url(self) -> str:
        """A new one-time login link to the page (once serving)."""
        return login_url(self.url, self.sessions.mint_code())

    async def stop(self) -> None:
        """End the event streams, then stop serving (idempotent)."""
        await self._control.stop(grace=0.5)
        await self._http.stop()

    def address(self, driver_id: str) -> DriverAddress:
        """Where workers find this driver, as the journal publishes it (signed there with the
        job token). With TLS it carries the certificate, so workers of an earlier driver pin
        it (a restarted driver's certificate is new); no private key is ever published."""
        cert = self.tls.cert_pem if self.tls is not None else None
        return DriverAddress(
            driver_id=driver_id,
            url=self.url,
            control_address=self.control_address,
            host=os.uname().nodename,
            pid=os.getpid(),
            tls_cert=cert.decode() if cert is not None else None,
        )
