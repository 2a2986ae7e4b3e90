"""The page's logins in-process: nothing of the job without the token or a page session, a
one-time code works once and only for a while, and nothing of the job (reads, buttons) for the
session cookie alone: a request needs its session's page secret, which only a login's answer
holds, so neither a cross-site form nor another service that received the cookie gets in."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

import httpx
import pytest

from elastic.driver.control.events import WorkerListener
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.server.app import create_app
from elastic.driver.server.auth import LOGIN_BODY_BYTES, PAGE_SECRET_NEEDED
from elastic.driver.server.endpoints import Endpoints
from elastic.driver.server.page_api import SharedStatus
from elastic.driver.server.services import Services
from elastic.driver.server.sessions import PageSessions, SessionLimits
from elastic.driver.settings import Settings
from elastic.protocol.http import HostStatus, JobStatus, WorkerStatus

TOKEN = "page-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET_META = re.compile(r'<meta name="elasticrun-page-secret" content="([A-Za-z0-9_-]{43})">')
JOB_ID = "job-7f3a2c"
HOST = "host-alpha"
STATUS = JobStatus(
    job_id=JOB_ID,
    round=3,
    size=1,
    hosts=[HostStatus(hostname=HOST, slots=2)],
    workers=[WorkerStatus(worker_id="w-0", rank=0, hostname=HOST, local_rank=0, state="member")],
)


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Driver:
    """What the page's buttons asked the driver, and a monotonic clock the test moves."""

    clock: FakeClock = field(default_factory=FakeClock)
    drained: list[tuple[str, bool]] = field(default_factory=list)
    stops: int = 0

    def set_drained(self, hostname: str, drained: bool) -> str:
        if hostname != HOST:
            raise LookupError(f"job {JOB_ID} has no host {hostname!r} (it has: {HOST})")
        self.drained.append((hostname, drained))
        return f"host {hostname} is {'drained' if drained else 'undrained'}"

    def stop_job(self) -> None:
        self.stops += 1


Check = Callable[[httpx.AsyncClient, Driver, PageSessions], Awaitable[None]]


def run(check: Check, *, can_steer: bool = True, base_url: str = "http://driver") -> None:
    """Run `check` against a fresh app with a fake clock, through an in-process client."""
    driver = Driver()
    services = Services(
        TOKEN,
        MemoryKeyValueStore(),
        Rendezvous(),
        lambda: STATUS,
        set_drained=driver.set_drained if can_steer else None,
        stop_job=driver.stop_job if can_steer else None,
    )
    sessions = PageSessions(SessionLimits(), clock=driver.clock)
    app = create_app(services, sessions=sessions)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            await check(client, driver, sessions)

    asyncio.run(main())


async def code_login(client: httpx.AsyncClient) -> httpx.Response:
    """Mint a code with the token (as `elasticrun status` would) and open its link."""
    minted = await client.post("/v1/login-codes", headers=AUTH)
    assert minted.status_code == 201, minted.text
    url = minted.json()["url"]
    assert url.startswith("http://driver/ui/login?code=") and TOKEN not in url
    return await client.get(url.removeprefix("http://driver"))


def page_headers(entered: httpx.Response) -> dict[str, str]:
    """What the page sends with every request after the login answered `entered`: the page
    secret the entering page handed to `enter.js`."""
    found = SECRET_META.search(entered.text)
    assert found is not None, entered.text
    return {"X-Elasticrun-Page": found.group(1)}


def test_a_stranger_gets_the_login_page_and_no_data() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{sessions.cookie}=x"}):
            page = await client.get("/ui", headers=headers)
            assert page.status_code == 200
            assert 'name="token"' in page.text  # the login form
            for secret in (JOB_ID, HOST, TOKEN):
                assert secret not in page.text
            assert "Workers" not in page.text
            data = await client.get("/ui/api/status", headers=headers)
            assert data.status_code == 401
            assert JOB_ID not in data.text and HOST not in data.text
            assert data.json()["detail"].startswith("log in first")
        assert (await client.get("/ui/assets/page.js")).status_code == 200  # no data in it

    run(check)


def test_a_login_code_opens_one_session_once() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        entered = await code_login(client)
        assert entered.status_code == 200
        assert '<script src="/ui/assets/enter.js" defer></script>' in entered.text
        assert entered.headers["cache-control"] == "no-store"
        page_secret = page_headers(entered)
        cookie = entered.headers["set-cookie"]
        assert cookie.startswith(f"{sessions.cookie}=")
        for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
            assert attribute in cookie
        assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back
        page = await client.get("/ui")
        assert "Workers" in page.text and 'name="token"' not in page.text
        assert page_secret["X-Elasticrun-Page"] not in page.text  # only the login's answer
        status = await client.get("/ui/api/status", headers=page_secret)
        assert status.status_code == 200 and status.json()["job_id"] == JOB_ID

        client.cookies.clear()
        again = await client.get(str(entered.request.url))
        assert again.status_code == 401
        assert "used already or has expired" in again.text
        assert "set-cookie" not in again.headers
        assert (await client.get("/ui/api/status", headers=page_secret)).status_code == 401

    run(check)


def test_a_login_code_expires_after_ten_minutes() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        late, in_time = sessions.mint_code(), sessions.mint_code()
        driver.clock.now += 599
        entered = await client.get("/ui/login", params={"code": in_time})
        assert entered.status_code == 200 and SECRET_META.search(entered.text)
        client.cookies.clear()
        driver.clock.now += 2  # 601 s after both were minted
        refused = await client.get("/ui/login", params={"code": late})
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        assert (await client.get("/ui/api/status")).status_code == 401
        unknown = await client.get("/ui/login", params={"code": "made-up"})
        assert unknown.status_code == 401

    run(check)


def test_a_session_ends_when_it_expires_or_logs_out() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        page = page_headers(await code_login(client))
        driver.clock.now += sessions.limits.session_lifetime - 1
        assert (await client.get("/ui/api/status", headers=page)).status_code == 200
        driver.clock.now += 1
        assert (await client.get("/ui/api/status", headers=page)).status_code == 401

        page = page_headers(await code_login(client))
        out = await client.post("/ui/api/logout", headers=page)
        assert out.status_code == 200 and out.json() == {"message": "logged out"}
        assert (await client.get("/ui/api/status", headers=page)).status_code == 401

    run(check)


def test_the_token_form_logs_in_and_a_wrong_token_is_refused() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        wrong = await client.post("/ui/login", data={"token": "not-the-token"})
        assert wrong.status_code == 401
        assert "not the job token" in wrong.text and "set-cookie" not in wrong.headers
        assert (await client.get("/ui/api/status")).status_code == 401

        right = await client.post("/ui/login", data={"token": TOKEN})
        assert right.status_code == 200 and "/ui/assets/enter.js" in right.text
        assert right.headers["set-cookie"].startswith(f"{sessions.cookie}=")
        assert TOKEN not in right.headers["set-cookie"]  # the cookie holds a session id
        assert TOKEN not in right.text
        page = page_headers(right)
        assert (await client.get("/ui/api/status", headers=page)).status_code == 200

        client.cookies.clear()
        bad_form = await client.post("/ui/login", content=b"token=a&" * 10)
        assert bad_form.status_code == 400
        huge = await client.post("/ui/login", content=b"x" * (LOGIN_BODY_BYTES + 1))
        assert huge.status_code == 413  # a stranger's body is cut short, not read whole

    run(check)


def test_a_page_session_opens_the_page_only_not_the_api() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        page = page_headers(await code_login(client))
        assert (await client.get("/ui/api/status", headers=page)).status_code == 200
        assert (await client.get("/v1/status", headers=page)).status_code == 401
        assert (await client.post("/v1/login-codes")).status_code == 401
        assert (await client.post("/v1/login-codes", headers=AUTH)).status_code == 201

    run(check)


PAGE_ROUTES = [
    ("GET", "/ui/api/status"),
    ("POST", f"/ui/api/hosts/{HOST}/drain"),
    ("DELETE", f"/ui/api/hosts/{HOST}/drain"),
    ("POST", "/ui/api/stop"),
    ("POST", "/ui/api/logout"),
]


def test_the_session_cookie_without_its_page_secret_reads_and_presses_nothing() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        other = page_headers(await code_login(client))  # a second session's secret
        page = page_headers(await code_login(client))  # the cookie now names this session
        assert page != other
        for method, path in PAGE_ROUTES:
            # what another service that received the cookie could send: the cookie and the
            # page's header, without the secret, with a made-up one, or another session's
            made_up = {"X-Elasticrun-Page": "é".encode("latin-1") * 43}  # not even ASCII
            for headers in ({}, {"X-Elasticrun-Page": "1"}, made_up, other):
                refused = await client.request(method, path, headers=headers)
                assert refused.status_code == 403, (method, path, headers)
                assert refused.json() == {"detail": PAGE_SECRET_NEEDED}
                assert JOB_ID not in refused.text
        assert driver.drained == [] and driver.stops == 0

        status = await client.get("/ui/api/status", headers=page)
        assert status.status_code == 200 and status.json()["job_id"] == JOB_ID
        drained = await client.post(f"/ui/api/hosts/{HOST}/drain", headers=page)
        assert drained.status_code == 200, drained.text
        assert drained.json() == {
            "hostname": HOST,
            "drained": True,
            "message": f"host {HOST} is drained",
        }
        undrained = await client.delete(f"/ui/api/hosts/{HOST}/drain", headers=page)
        assert undrained.json()["message"] == f"host {HOST} is undrained"
        stopped = await client.post("/ui/api/stop", headers=page)
        assert stopped.status_code == 200 and stopped.json()["message"].startswith("the job stops")
        assert driver.drained == [(HOST, True), (HOST, False)] and driver.stops == 1

        # With the token no page secret is needed: a browser never adds the token by itself.
        client.cookies.clear()
        assert (await client.post("/ui/api/stop", headers=AUTH)).status_code == 200

    run(check)


def test_two_drivers_on_one_host_keep_their_own_sessions() -> None:
    """Two drivers serving on two loopback ports, one browser-like cookie jar (cookies ignore
    the port): logging in to the second leaves the first logged in, and each session's page
    secret opens its own driver only."""
    settings = Settings(np=1, hosts=[HostSpec("localhost", 1)], command=["train.py"])

    def driver(token: str) -> Endpoints:
        services = Services(token, MemoryKeyValueStore(), Rendezvous(), lambda: STATUS)
        return Endpoints(settings, "127.0.0.1", services, cast(WorkerListener, object()))

    async def main() -> None:
        first, second = driver(TOKEN), driver(TOKEN + "-2")
        await first.start()
        await second.start()
        try:
            async with httpx.AsyncClient(timeout=10) as browser:
                pages = []
                for endpoints in (first, second):
                    entered = await browser.get(endpoints.login_url())
                    assert entered.status_code == 200, entered.text
                    port = endpoints.url.rsplit(":", 1)[1]
                    assert entered.cookies.keys() == {f"elasticrun_session_{port}"}
                    pages.append(page_headers(entered))
                assert len(browser.cookies) == 2  # one per driver, neither replaced
                drivers = zip((first, second), pages, pages[::-1], strict=True)
                for endpoints, page, others in drivers:
                    status = await browser.get(f"{endpoints.url}/ui/api/status", headers=page)
                    assert status.status_code == 200, status.text
                    assert status.json()["job_id"] == JOB_ID
                    crossed = await browser.get(f"{endpoints.url}/ui/api/status", headers=others)
                    assert crossed.status_code == 403
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(main())


def test_draining_an_unknown_host_is_one_clear_line() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        answer = await client.post("/ui/api/hosts/nowhere/drain", headers=AUTH)
        assert answer.status_code == 404
        assert answer.json() == {"detail": f"job {JOB_ID} has no host 'nowhere' (it has: {HOST})"}

    run(check)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", f"/ui/api/hosts/{HOST}/drain"), ("DELETE", f"/ui/api/hosts/{HOST}/drain"),
     ("POST", "/ui/api/stop")],
)  # fmt: skip
def test_a_driver_that_cannot_steer_says_so(method: str, path: str) -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        answer = await client.request(method, path, headers=AUTH)
        assert answer.status_code == 503
        assert answer.json()["detail"].startswith("this driver cannot")

    run(check, can_steer=False)


def test_over_tls_the_cookie_is_secure_and_the_page_forbids_framing() -> None:
    async def check(client: httpx.AsyncClient, driver: Driver, sessions: PageSessions) -> None:
        right = await client.post("/ui/login", data={"token": TOKEN})
        assert "Secure" in right.headers["set-cookie"]
        page = await client.get("/ui")
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"

    run(check, base_url="https://driver")


def test_sessions_and_codes_are_bounded_oldest_first() -> None:
    clock = FakeClock()
    sessions = PageSessions(SessionLimits(max_codes=2, max_sessions=2), clock=clock)
    codes = [sessions.mint_code() for _ in range(3)]
    assert sessions.redeem(codes[0]) is None  # forgotten for the newer two
    opened = [sessions.redeem(codes[1]), sessions.redeem(codes[2]), sessions.open_session()]
    assert not sessions.is_session(opened[0]) and all(map(sessions.is_session, opened[1:]))
    assert sessions.counts == (0, 2)
    clock.now += sessions.limits.code_lifetime + 1
    sessions.mint_code()  # minting forgets the expired
    assert sessions.counts[0] == 1


def test_every_open_page_shares_one_status_per_half_second() -> None:
    clock, built = FakeClock(), []

    def status() -> JobStatus:
        built.append(clock.now)
        return STATUS.model_copy(update={"round": len(built), "epoch": len(built)})

    shared = SharedStatus(max_age=0.5, clock=clock)
    first = shared.json(status)
    clock.now += 0.49
    assert shared.json(status) is first and len(built) == 1  # a second page's poll
    clock.now += 0.01
    assert JobStatus.model_validate_json(shared.json(status)).round == 2
