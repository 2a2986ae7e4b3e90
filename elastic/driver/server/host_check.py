"""Which names the driver's HTTP server answers to (the Host header), on every route.

A page on another site can point a name of its own at the driver's address (DNS rebinding):
the visitor's browser then sends the site's requests to the driver, with the site's name in
`Host`, and hands the answers to the site's script. Open routes (`/metrics`, the page's login
and files) would be read that way. So a request is served only when its Host names this
server (`AllowedHosts.for_server`):

* the address it is bound to, the one workers are told (`ELASTIC_DRIVER_URL`, the job file,
  etcd), with any port or none; bound to every address (`0.0.0.0`, `::`): the address the
  connection reached;
* the loopback names (`localhost`, `127.0.0.1`, `[::1]`, ...) when bound to a loopback address;
* the machine's host name and fully qualified name;
* the names of `--allowed-hosts` (a proxy, a DNS name): `name` with any port, `name:port` with
  that port only; `*` lets every name through (no check).

Anything else gets 421 (Misdirected Request), before the token is looked at and before any of
the body is read. A request without a Host header (HTTP/1.0) is served: every browser sends
one, and a client that is not a browser can send whatever Host it likes anyway, so the header
is no proof of anything but a browser's idea of where it is. Names compare without case and
without a trailing dot; IP literals compare as addresses (`[0:0::1]` is `[::1]`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from elastic.driver.server.limits import LimitLog, refusal

log = logging.getLogger(__name__)

ANY_HOST = "*"
LOOPBACK_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "127.0.0.1", "::1"}
)
MISDIRECTED = "misdirected request: this driver does not serve that host name (see --allowed-hosts)"
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


def split_host(text: str) -> tuple[str, int | None]:
    """The name and port of a Host value (`name`, `name:port`, `[v6]`, `[v6]:port`): the name
    lower case, without a trailing dot, an IP literal as `ipaddress` writes it (no brackets).
    Raises ValueError for anything else (a scheme, a path, a space, an empty or bad port)."""
    if text.startswith("["):
        literal, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"{text!r}: an IPv6 literal without its ']'")
        try:
            name = str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise ValueError(f"{text!r}: not an IPv6 address in brackets") from None
    else:
        name, colon, port_text = text.partition(":")
        rest = colon + port_text
        name = name.lower().removesuffix(".")
        if not name or len(name) > 253 or not all(_LABEL.fullmatch(p) for p in name.split(".")):
            raise ValueError(f"{text!r}: not a host name or address")
        with contextlib.suppress(ValueError):  # a dotted IPv4 address, as written
            name = str(ipaddress.IPv4Address(name))
    if not rest:
        return name, None
    port_text = rest.removeprefix(":")
    if rest[0] != ":" or not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return name, int(port_text)


def check_allowed_host(entry: str) -> str:
    """`entry` of `--allowed-hosts` as given, when it is `*`, a name or address, with a port
    or not; raises ValueError naming what is wrong otherwise."""
    if entry != ANY_HOST:
        split_host(entry)
    return entry


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class AllowedHosts:
    """The Host values one server answers to (see the module's docstring)."""

    names: frozenset[str]  # with any port, or none
    named_ports: frozenset[tuple[str, int]]  # with this port only
    any_local_address: bool  # bound to every address: the one the connection reached passes
    anything: bool  # `*`: no check

    @classmethod
    def for_server(
        cls, bound: str, machine_names: Iterable[str] = (), extra: Iterable[str] = ()
    ) -> AllowedHosts:
        """The names of a server bound to address `bound` on a machine called
        `machine_names`, plus `extra` (`--allowed-hosts` entries). Raises ValueError for a
        bad entry of `extra`."""
        own = split_host(f"[{bound}]" if ":" in bound else bound)[0]
        names = {own}
        address = _address(own)
        if address is not None and address.is_loopback:
            names |= LOOPBACK_NAMES
        for name in machine_names:
            with contextlib.suppress(ValueError):  # a name no browser could send: none
                names.add(split_host(name)[0])
        named_ports = set()
        extra = [check_allowed_host(entry) for entry in extra]
        for entry in extra:
            if entry != ANY_HOST:
                name, port = split_host(entry)
                if port is None:
                    names.add(name)
                else:
                    named_ports.add((name, port))
        return cls(
            frozenset(names),
            frozenset(named_ports),
            any_local_address=address is not None and address.is_unspecified,
            anything=ANY_HOST in extra,
        )

    def allows(self, value: bytes, local_address: str | None = None) -> bool:
        """Whether a Host header `value` names this server; `local_address`: the address the
        connection reached (counts when bound to every address)."""
        if self.anything:
            return True
        try:
            name, port = split_host(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return False
        if name in self.names or (port is not None and (name, port) in self.named_ports):
            return True
        if self.any_local_address and local_address is not None:
            reached = _address(local_address)
            return reached is not None and _address(name) == reached
        return False


class HostCheck:
    """Pure ASGI middleware: 421 (`{"detail": ...}`, connection closed) to a request whose
    Host header, or any one of several, is not one of `allowed`'s; the rest go on to `app`.
    Nothing of the request is read but its headers. Refusals are logged at most once a minute,
    with their count."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed
        self._log = LimitLog(log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            local = (scope.get("server") or (None, None))[0]
            given = [value for name, value in scope["headers"] if name == b"host"]
            if not all(self.allowed.allows(value, local) for value in given):
                client = scope.get("client")
                self._log.note(
                    "misdirected",
                    "refused HTTP requests for a host name this driver does not serve "
                    "(first from %s: Host %r); add the name with --allowed-hosts if it is yours",
                    client[0] if client else "unknown",
                    given[0][:100].decode("latin-1") if given else "",
                )
                await refusal(421, MISDIRECTED)(scope, receive, send)
                return
        await self.app(scope, receive, send)
