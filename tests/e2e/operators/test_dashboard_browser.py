"""The driver's page in a real browser (Debian's headless Chromium, driven by Selenium through
its chromedriver) on a real elastic job: a login link from `elasticrun status --login` opens
it, the workers appear with their ranks, a killed worker's re-form appears in the rounds
timeline with its cause, and another web service on the host, which the browser hands the
page's cookie, can neither read the job nor press its buttons. Skips with one line where this
machine has no such browser."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.paths import WORKERS
from tests.support.prerequisites import Machine, missing_browser
from tests.support.running_job import ELASTICRUN, RunningJob

Rows = list[dict[str, str]]
ROWS = """
return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].map(
  (tr) => ({...tr.dataset, text: tr.innerText}));
"""

STATUS = """
const secret = window.localStorage.getItem("elasticrun-page-secret");
fetch("/ui/api/status", {headers: {"X-Elasticrun-Page": secret}})
  .then((answer) => answer.json()).then(arguments[0]);
"""


class Neighbour:
    """Another web service on this host, on a loopback port of its own: it answers every GET
    with a short page and keeps the `Cookie` headers browsers send it."""

    def __init__(self) -> None:
        cookies: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                cookies.append(self.headers.get("Cookie", ""))
                body = b"<!doctype html><title>another service</title><p>hello"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.cookies = cookies
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def neighbour() -> Iterator[Neighbour]:
    service = Neighbour()
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium with its own profile in `tmp_path`; quit (both processes) at the end."""
    if reason := missing_browser(Machine.here()):
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    machine = Machine.here()
    options = Options()
    options.binary_location = str(machine.which("chromium"))
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root has no user namespace sandbox here
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(argument)
    service = Service(
        executable_path=str(machine.which("chromedriver")),
        log_output=str(tmp_path / "chromedriver.log"),
    )
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def rows(browser: Any, table: str) -> Rows:
    """The rows the page shows in table `table`: each row's data attributes and its text."""
    return browser.execute_script(ROWS, table)


def shown_until(
    browser: Any, job: RunningJob, what: str, holds: Callable[[Any], bool], timeout: float = 60
) -> None:
    """Wait (polling the page every 0.2 s, at most `timeout` s) until `holds(browser)`."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(browser, timeout, poll_frequency=0.2).until(holds)
    except TimeoutException:
        page = {t: rows(browser, t) for t in ("hosts", "workers", "rounds")}
        raise AssertionError(
            f"the page never showed {what} within {timeout:g} s; it showed {page}; "
            f"answer: {browser.find_element('id', 'answer').text!r}\n{job.transcript()}"
        ) from None


def login_link(job: RunningJob) -> str:
    """A new one-time login link from `elasticrun status --login`, as the launcher's captured
    output (not a terminal) says to get one."""
    hint = r"dashboard: no login link .*`elasticrun status --login --job-id ([\w.-]+)`"
    job_id = job.wait_for(hint, 60).group(1)
    login = subprocess.run(
        [*ELASTICRUN, "status", "--login", "--job-id", job_id],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found = re.match(r"(http://127\.0\.0\.1:\d+/ui/login\?code=\S+) ", login.stdout)
    assert found is not None, (login.stdout, login.stderr)
    return found.group(1)


def log_in(browser: Any, job: RunningJob) -> str:
    """Open a new login link; return the page's URL, once it shows."""
    login = login_link(job)
    page = login.split("/login?")[0]
    browser.get(login)
    shown_until(browser, job, "the page", lambda b: b.current_url == page)
    return page


def test_the_page_shows_a_live_job_and_a_killed_workers_round(
    elasticrun: Callable[..., RunningJob], browser: Any, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "2", "--max-np", "3", "--heartbeat-interval", "0.5",
         "--failure-scope", "worker",  # the killed worker alone leaves; its host-mates stay
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "400", "--step-delay", "0.05"]
    )  # fmt: skip
    page = login_link(job).split("/login?")[0]
    browser.get(page)  # not logged in: the login form, and nothing of the job
    assert browser.find_elements("css selector", "input[name=token]")
    assert not browser.find_elements("id", "workers")
    log_in(browser, job)

    def members(b: Any) -> bool:  # a pid is shown once a worker's control stream is open
        shown = [r for r in rows(b, "workers") if r["state"] == "member" and "pid" in r]
        return sorted(r.get("rank", "") for r in shown) == ["0", "1", "2"]

    shown_until(browser, job, "three members with ranks 0, 1, 2 and their pids", members)
    workers = {r["rank"]: r for r in rows(browser, "workers")}
    assert all(r["text"].split("\t")[1] == "localhost" for r in workers.values()), workers
    assert browser.find_element("id", "round").text == "1"
    assert [r["hostname"] for r in rows(browser, "hosts")] == ["localhost"]

    # The token reaches the workers (in their environment) and no launcher line.
    victim = int(workers["2"]["pid"])
    environ = Path(f"/proc/{victim}/environ").read_bytes().split(b"\0")
    token = next(v for v in environ if v.startswith(b"ELASTIC_TOKEN=")).split(b"=", 1)[1]
    assert token.decode() not in job.output

    def stepping(b: Any) -> bool:  # the step rate column is filled from heartbeats
        return all(r["text"].split("\t")[6] not in ("–", "0.00") for r in rows(b, "workers"))

    shown_until(browser, job, "a step rate for every worker", stepping)
    os.kill(victim, signal.SIGKILL)

    def failed(b: Any) -> bool:
        by_pid = {r.get("pid"): r for r in rows(b, "workers")}
        return by_pid.get(str(victim), {}).get("state") == "failed"

    shown_until(browser, job, f"worker pid {victim} failed", failed)
    ended = next(r for r in rows(browser, "workers") if r.get("pid") == str(victim))
    assert "failed (signal SIGKILL)" in ended["text"], ended
    assert browser.find_element("id", "ended").text == "1 worker(s) ended: 1 signal SIGKILL"

    # The rounds timeline (filled by the driver's RoundTimeline): round 2, for the failure,
    # with its recovery legs measured.
    def reformed(b: Any) -> bool:
        return any(r["round"] == "2" and r["cause"] == "failure" for r in rows(b, "rounds"))

    shown_until(browser, job, "round 2 caused by the failure", reformed)
    round_two = next(r for r in rows(browser, "rounds") if r["round"] == "2")
    noticed_to_formed = round_two["text"].split("\t")[4]
    assert noticed_to_formed.endswith(" s"), round_two

    def two_members(b: Any) -> bool:
        shown = rows(b, "workers")
        return sorted(r.get("rank", "") for r in shown if r["state"] == "member") == ["0", "1"]

    shown_until(browser, job, "two members after the re-form", two_members)
    assert browser.find_element("id", "round").text == "2"
    assert "failure" in browser.find_element("id", "rounds").text
    # The launcher's log tail shows when the status holds one (the logs helper's LogTail
    # fills JobStatus.log_tail; both are empty until it is on main). It moves on with every
    # line, so the page's copy and a second look need not be equal; both are empty or not.
    status = browser.execute_async_script(STATUS)
    assert status["round"] == 2
    assert bool(browser.find_element("id", "log").text) == bool(status["log_tail"])

    screenshot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    job.stop()


def test_the_page_names_the_ranks_of_a_stall(
    elasticrun: Callable[..., RunningJob], browser: Any
) -> None:
    job = elasticrun(
        ["-np", "4", "--min-np", "2", "--heartbeat-interval", "0.5", "--stall-warning", "2",
         sys.executable, str(WORKERS / "stall_job.py")]
    )  # fmt: skip
    log_in(browser, job)
    assert not browser.find_element("id", "stall").is_displayed()

    def banner(b: Any) -> bool:
        return b.find_element("id", "stall").is_displayed()

    shown_until(browser, job, "the stall banner", banner, timeout=90)
    line = browser.find_element("id", "stall-line").text
    logged = job.wait_for(r"stall in round 1: .*", 30).group(0)

    # The page's line is the logged one, with the wait counted on since it was logged.
    def waited(text: str) -> str:
        return re.sub(r"waited \d+ s", "waited N s", text)

    assert waited(line) == waited(logged), (line, logged)
    assert "rank 1 on host localhost (not in a collective, last step 3)" in line
    waiting = {r["rank"]: r["text"] for r in rows(browser, "workers")}
    assert ", waiting " in waiting["0"].split("\t")[10], waiting
    job.stop()


def test_the_stop_button_asks_first_then_ends_the_job(
    elasticrun: Callable[..., RunningJob], browser: Any, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "--heartbeat-interval", "0.5",
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "400", "--step-delay", "0.05"]
    )  # fmt: skip
    log_in(browser, job)
    shown_until(browser, job, "two members", lambda b: len(rows(b, "workers")) == 2)
    browser.find_element("id", "stop").click()
    browser.switch_to.alert.dismiss()  # "Stop the job?" No: nothing is asked of the driver
    assert not browser.find_element("id", "answer").is_displayed()
    assert job.process.poll() is None

    browser.find_element("id", "stop").click()
    browser.switch_to.alert.accept()
    shown_until(browser, job, "the answer", lambda b: b.find_element("id", "answer").text)
    answer = browser.find_element("id", "answer").text
    assert answer == "the job stops: every worker is being stopped", answer
    assert job.finish(60) == 0, job.transcript()


def test_the_drain_button_takes_a_host_out_and_undrain_gives_it_back(
    elasticrun: Callable[..., RunningJob], browser: Any, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.sh"
    hosts.write_text("#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n")
    hosts.chmod(0o755)
    job = elasticrun(
        ["--min-np", "2", "--max-np", "4", "--host-discovery-script", str(hosts),
         "--discovery-interval", "0.5", "--heartbeat-interval", "0.5",
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "400", "--step-delay", "0.05"]
    )  # fmt: skip
    log_in(browser, job)

    def members_on(b: Any, hostname: str) -> int:
        shown = rows(b, "workers")
        return sum(r["state"] == "member" and r["text"].split("\t")[1] == hostname for r in shown)

    shown_until(browser, job, "two members on 127.0.0.1", lambda b: members_on(b, "127.0.0.1") == 2)
    drain = '#hosts tr[data-hostname="127.0.0.1"] button'
    browser.find_element("css selector", drain).click()
    browser.switch_to.alert.accept()  # "Drain 127.0.0.1? ..."
    shown_until(browser, job, "the answer", lambda b: b.find_element("id", "answer").text)
    answer = browser.find_element("id", "answer").text
    assert answer.startswith("host 127.0.0.1 is drained"), answer

    def drained(b: Any) -> bool:
        host = [r for r in rows(b, "hosts") if r["hostname"] == "127.0.0.1"]
        return bool(host) and host[0]["state"] == "drained" and members_on(b, "127.0.0.1") == 0

    shown_until(browser, job, "127.0.0.1 drained, its workers gone", drained)
    assert browser.find_element("css selector", drain).text == "Undrain"
    assert members_on(browser, "localhost") == 2

    browser.find_element("css selector", drain).click()  # undrain asks nothing
    shown_until(browser, job, "127.0.0.1 with members again", lambda b: members_on(b, "127.0.0.1"))
    job.stop()


def test_another_service_on_the_host_gets_the_cookie_but_not_the_job(
    elasticrun: Callable[..., RunningJob], browser: Any, tmp_path: Path, neighbour: Neighbour
) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "--heartbeat-interval", "0.5",
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "400", "--step-delay", "0.05"]
    )  # fmt: skip
    page = log_in(browser, job)
    shown_until(browser, job, "two members", lambda b: len(rows(b, "workers")) == 2)
    driver = page.removesuffix("/ui")
    port = driver.rsplit(":", 1)[1]

    # The logged-in browser visits the other service, under /ui: it is handed the cookie.
    browser.get(f"http://127.0.0.1:{neighbour.port}/ui/anything")
    cookie = next((c for c in neighbour.cookies if f"elasticrun_session_{port}=" in c), None)
    assert cookie is not None, neighbour.cookies

    # Replayed from that service, with the page's header (a script adds it), the cookie reads
    # nothing and presses nothing.
    replays = [
        ("GET", "/ui/api/status"),
        ("POST", "/ui/api/hosts/localhost/drain"),
        ("POST", "/ui/api/stop"),
    ]
    with httpx.Client(base_url=driver, timeout=10) as service:
        for marker in ("1", "", "x" * 43):
            for method, path in replays:
                headers = {"Cookie": cookie, "X-Elasticrun-Page": marker}
                answer = service.request(method, path, headers=headers)
                assert answer.status_code == 403, (method, path, answer.text)
                assert "page secret" in answer.json()["detail"]
        shell = service.get("/ui", headers={"Cookie": cookie})  # the page's HTML: no data
        assert shell.status_code == 200 and "elasticrun-page-secret" not in shell.text
        assert (service.get("/v1/status", headers={"Cookie": cookie})).status_code == 401

    # The page itself still reads the job (nothing drained, nothing stopped) and its buttons
    # still work.
    browser.get(page)

    def undrained(b: Any) -> bool:
        return [h["state"] for h in rows(b, "hosts")] == ["active"]

    shown_until(browser, job, "localhost, active", undrained)
    assert len(rows(browser, "workers")) == 2 and job.process.poll() is None
    browser.find_element("id", "stop").click()
    browser.switch_to.alert.accept()
    shown_until(browser, job, "the answer", lambda b: b.find_element("id", "answer").text)
    answer = browser.find_element("id", "answer").text
    assert answer == "the job stops: every worker is being stopped", answer
    assert job.finish(60) == 0, job.transcript()
