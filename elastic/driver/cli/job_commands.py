"""`elasticrun status`, `drain HOST`, `undrain HOST` and `stop`: an operator's commands to a
running job.

The driver is found by its job file (jobs this user started on this host; see
`elastic.driver.job_file`) or, with --etcd-endpoints, by the job's documents in etcd (from
any host that reaches etcd and the driver). etcd holds no token: through etcd the commands
take it from --token-file, $ELASTICRUN_TOKEN, this host's job file or the terminal
(`elastic.driver.journal.job_token`), and send it only to a driver address whose MAC verifies
with it. The commands talk to the driver's HTTP API with the job's token; they never print it.

Exit codes: 0 done; 1 no such job, a host the job does not know, or a driver that does not
answer; 2 bad flags, or several running jobs and no --job-id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from elastic.driver.cli.backend_flags import (
    FlagParser,
    add_etcd_flags,
    add_token_flag,
    etcd_options,
)
from elastic.driver.cli.etcd_status import PUBLIC, describe
from elastic.driver.cli.status_text import render
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.job_file import SeveralJobs, find_job
from elastic.driver.journal.backend import BackendError
from elastic.driver.journal.etcd import EtcdBackend
from elastic.driver.journal.job_token import find_token, given_token
from elastic.protocol.env import AUTH_SCHEME
from elastic.protocol.etcd import DriverAddress, EtcdOptions
from elastic.protocol.etcd_trust import token_matches
from elastic.protocol.http import DrainResponse, JobStatus, LoginCode, StopResponse
from elastic.protocol.pinning import pinned_ssl_context

COMMANDS = ("status", "drain", "undrain", "stop")
TIMEOUT = 10.0  # seconds a driver has to answer

_ABOUT = {
    "status": "Show a running job: its round, hosts, workers (step rate, commit and heartbeat "
    "age, collective), a stall, its newest rounds and decisions, and its URLs.",
    "drain": "Take HOST out of a running job: its workers leave at their next step (nothing "
    "rolled back), and it gets no new workers until undrained.",
    "undrain": "Give a drained HOST back to the job: its free slots are filled again.",
    "stop": "End a running job cleanly: every worker is stopped and the launcher exits 0.",
}


class Unanswered(LaunchError):
    """The driver could not be reached, or refused the request (the message says why)."""


@dataclass(frozen=True)
class Driver:
    """A running job's driver, and what it takes to call it."""

    job_id: str
    url: str
    token: str
    cert: bytes | None

    def call(self, method: str, path: str) -> httpx.Response:
        """One request with the token; raises `Unanswered` when the driver does not answer."""
        verify = pinned_ssl_context(self.cert) if self.cert is not None else True
        headers = {"Authorization": f"{AUTH_SCHEME} {self.token}"}
        try:
            with httpx.Client(verify=verify, timeout=TIMEOUT) as client:
                return client.request(method, self.url + path, headers=headers)
        except httpx.HTTPError as err:
            raise Unanswered(
                f"the driver of job {self.job_id} at {self.url} does not answer: {err}"
            ) from None


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = FlagParser(prog=f"elasticrun {command}", description=_ABOUT[command])
    if command in ("drain", "undrain"):
        parser.add_argument("host", metavar="HOST", help="the host's name, as discovery gives it")
    parser.add_argument(
        "--job-id",
        metavar="ID",
        help="the job (default: the only job this user runs on this host; with "
        "--etcd-endpoints, required)",
    )
    if command == "status":
        parser.add_argument(
            "--json", action="store_true", help="print the job's status as JSON, URLs included"
        )
        parser.add_argument(
            "--login",
            action="store_true",
            help="print a new one-time login link to the job's page instead (10 minutes)",
        )
    etcd = parser.add_argument_group(
        "jobs in etcd", "a job run with --backend etcd, from any host that reaches etcd"
    )
    add_etcd_flags(etcd, "where the job's state is")
    add_token_flag(etcd)
    if command == "status":
        etcd.add_argument(
            "--saved",
            action="store_true",
            help="show what etcd holds of the job (what a restarted driver takes up), even "
            "while a driver runs it",
        )
    return parser


def _etcd(args: argparse.Namespace) -> EtcdOptions | None:
    options = etcd_options(args, wanted=args.etcd_endpoints is not None)
    if options is not None and args.job_id is None:
        raise UsageError("--etcd-endpoints needs --job-id")
    if options is None and getattr(args, "saved", False):
        raise UsageError("--saved needs --etcd-endpoints")
    if options is None and args.token_file is not None:
        raise UsageError("--token-file needs --etcd-endpoints (a job file holds the token)")
    return options


async def _read(options: EtcdOptions, job_id: str) -> dict[str, bytes]:
    backend = EtcdBackend(options, retry_for=5.0)
    try:
        return await backend.read(job_id)
    finally:
        await backend.close()


def _driver_in(args: argparse.Namespace, job_id: str, documents: dict[str, bytes]) -> Driver | None:
    """The running driver the documents name, or None (no such job, ended, no driver).

    Raises `LaunchError` (one line) when the job's token cannot be had (see the module), is
    not the job's, or the published address does not verify with it: the token is sent
    only to the job's own driver."""
    if "result" in documents or "driver" not in documents:
        return None
    given = given_token(getattr(args, "token_file", None), os.environ)
    token = find_token(job_id, given, "to reach its driver")
    check = documents.get("token_check")
    if check is not None and not token_matches(token.token, job_id, check):
        raise LaunchError(f"the token from {token.source} is not job {job_id}'s")
    try:
        address = DriverAddress.model_validate_json(documents["driver"])
        address.verified(token.token, job_id)
    except ValueError as err:
        raise LaunchError(f"refusing to send the job's token there: {err}") from None
    return Driver(job_id, address.url, token.token, address.cert_pem)


def _status(args: argparse.Namespace, options: EtcdOptions | None) -> int:
    if options is not None:
        documents = asyncio.run(_read(options, args.job_id))
        driver = None if args.saved else _driver_in(args, args.job_id, documents)
        if driver is None:  # asked for, ended, or between drivers: what etcd keeps
            if args.json:
                public = {n: json.loads(documents[n]) for n in PUBLIC if n in documents}
                print(json.dumps({"job_id": args.job_id, **public}, indent=2))
            else:
                print(describe(args.job_id, documents))
            return 0 if "spec" in documents else 1
    else:
        record = find_job(args.job_id)
        driver = Driver(record.job_id, record.urls.api, record.token,
                        record.tls_cert.encode() if record.tls_cert else None)  # fmt: skip
    if args.login:
        answer = driver.call("POST", "/v1/login-codes")
        if answer.status_code not in (200, 201):
            raise Unanswered(f"the driver of job {driver.job_id} answered {answer.status_code}")
        code = LoginCode.model_validate_json(answer.content)
        print(f"{code.url} (a one-time login link, for {code.expires_in / 60:.0f} minutes)")
        return 0
    answer = driver.call("GET", "/v1/status")
    if answer.status_code != 200:
        raise Unanswered(f"the driver of job {driver.job_id} answered {answer.status_code}")
    status = JobStatus.model_validate_json(answer.content)
    print(status.model_dump_json(indent=2) if args.json else render(status))
    return 0


def _find_driver(args: argparse.Namespace, options: EtcdOptions | None) -> Driver:
    if options is None:
        record = find_job(args.job_id)
        cert = record.tls_cert.encode() if record.tls_cert else None
        return Driver(record.job_id, record.urls.api, record.token, cert)
    driver = _driver_in(args, args.job_id, asyncio.run(_read(options, args.job_id)))
    if driver is None:
        raise LaunchError(f"job {args.job_id} has no running driver in etcd")
    return driver


def _operate(command: str, args: argparse.Namespace, options: EtcdOptions | None) -> int:
    driver = _find_driver(args, options)
    if command == "stop":
        answer = driver.call("POST", "/v1/stop")
        model: type[DrainResponse | StopResponse] = StopResponse
    else:
        path = f"/v1/hosts/{quote(args.host, safe='')}/drain"
        answer = driver.call("POST" if command == "drain" else "DELETE", path)
        model = DrainResponse
    if answer.status_code != 200:
        try:
            detail = answer.json()["detail"]
        except (ValueError, KeyError, TypeError):
            detail = f"the driver answered {answer.status_code}"
        raise Unanswered(str(detail))
    print(f"job {driver.job_id}: {model.model_validate_json(answer.content).message}")
    return 0


def job_command_main(command: str, argv: list[str]) -> int:
    """Run `elasticrun COMMAND ...`; returns the exit code (see the module's docstring)."""
    try:
        args = build_parser(command).parse_args(argv)
        options = _etcd(args)
        if command == "status":
            return _status(args, options)
        return _operate(command, args, options)
    except (UsageError, SeveralJobs) as err:
        print(f"elasticrun {command}: error: {err}", file=sys.stderr)
        return 2
    except (LaunchError, BackendError) as err:
        print(f"elasticrun {command}: error: {err}", file=sys.stderr)
        return 1
