"""The page's logins: one-time login codes and the sessions they open, bounded in number.

A code is what the driver's login line carries (`<api>/ui/login?code=...`) instead of the job
token: it opens one session, once, within `code_lifetime` seconds of being minted. A session
is what the page's cookie names. Both are random (256 bits) and kept only as SHA-256 digests,
so a lookup's timing says nothing about a live value. Nothing here outlives the driver: a
restarted driver's page needs a new login.

A session's *page secret* (`page_secret`) is what the page must show, besides its cookie, for
anything of the job (`/ui/api/...`): browsers send a host's cookies to every port of that
host, so another service on it may hold the cookie, but the secret is handed over only in the
answer to a login (the one-time code or the token), which lands in the page's own storage.
It is an HMAC of the session id under a key of this driver's, so it is bound to its session
and needs no storage.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE_PREFIX = "elasticrun_session"


def cookie_name(port: int) -> str:
    """The name of the page's session cookie for the driver serving on `port`: browsers tell
    cookies apart by host, name and path, not port, so two drivers on one host need two names
    (and a driver restarted on the same port replaces its old cookie rather than adding one)."""
    return f"{COOKIE_PREFIX}_{port}"


@dataclass(frozen=True)
class SessionLimits:
    code_lifetime: float = 600.0
    """Seconds a login code stays redeemable after it was minted."""
    session_lifetime: float = 12 * 3600.0
    """Seconds a session lasts after its login (then the page asks to log in again)."""
    max_codes: int = 64
    """Unredeemed codes kept; minting one more forgets the oldest."""
    max_sessions: int = 64
    """Sessions kept; opening one more ends the oldest."""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


class _Expiring:
    """Digests of random values with their deadlines, oldest first, at most `limit`."""

    def __init__(self, limit: int, lifetime: float, clock: Callable[[], float]) -> None:
        self._deadlines: OrderedDict[bytes, float] = OrderedDict()
        self._limit, self._lifetime, self._clock = limit, lifetime, clock

    def add(self, value: str) -> None:
        now = self._clock()
        for digest, deadline in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[digest]
        self._deadlines[_digest(value)] = now + self._lifetime
        while len(self._deadlines) > self._limit:
            self._deadlines.popitem(last=False)

    def live(self, value: str) -> bool:
        deadline = self._deadlines.get(_digest(value))
        return deadline is not None and self._clock() < deadline

    def discard(self, value: str) -> bool:
        """Forget `value`; True when it was live until now."""
        deadline = self._deadlines.pop(_digest(value), None)
        return deadline is not None and self._clock() < deadline

    def __len__(self) -> int:
        return len(self._deadlines)


class PageSessions:
    """One-time login codes and page sessions of one driver (owned by its app).

    `clock` is monotonic seconds; `new_secret()` returns a fresh URL-safe random string (tests
    pass a predictable one). `cookie` is the session cookie's name; a serving driver names it
    after its port (`cookie_name`, set once the port is bound), so two jobs' pages on one host
    (cookies ignore the port) do not log each other out.
    """

    def __init__(
        self,
        limits: SessionLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        new_secret: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        cookie: str = COOKIE_PREFIX,
    ) -> None:
        self.limits = limits or SessionLimits()
        self._codes = _Expiring(self.limits.max_codes, self.limits.code_lifetime, clock)
        self._sessions = _Expiring(self.limits.max_sessions, self.limits.session_lifetime, clock)
        self._new_secret = new_secret
        self._page_key = secrets.token_bytes(32)  # this driver's; dies with it
        self.cookie = cookie

    def mint_code(self) -> str:
        """A new login code, redeemable once within `limits.code_lifetime` seconds (the
        oldest unredeemed code is forgotten when `limits.max_codes` are held)."""
        code = self._new_secret()
        self._codes.add(code)
        return code

    def redeem(self, code: str) -> str | None:
        """A new session for a live `code`, which is used up; None for a code that is unknown,
        used or expired."""
        return self.open_session() if self._codes.discard(code) else None

    def open_session(self) -> str:
        """A new session id (for a caller that showed the job token); the oldest session ends
        when `limits.max_sessions` are held."""
        session = self._new_secret()
        self._sessions.add(session)
        return session

    def is_session(self, session: str | None) -> bool:
        """Whether `session` names a session that has not ended or expired."""
        return session is not None and self._sessions.live(session)

    def page_secret(self, session: str) -> str:
        """The page secret of `session` (43 URL-safe characters): the same for the session's
        whole life, different for every other session and every other driver."""
        mac = hmac.new(self._page_key, session.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()

    def is_page_secret(self, session: str, given: str) -> bool:
        """Whether `given` is the page secret of `session`; constant time in their content."""
        expected = self.page_secret(session).encode()
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)

    def close(self, session: str) -> None:
        """End `session` (logging out); nothing happens for an unknown one."""
        self._sessions.discard(session)

    @property
    def counts(self) -> tuple[int, int]:
        """(codes, sessions) held now, expired ones not yet forgotten included."""
        return len(self._codes), len(self._sessions)
