"""The flags that say where a job's state lives (`--backend`, `--etcd-*`, `--job-id`) and how
to reach it (etcd's TLS and user, the job's `--token-file`), shared by `elasticrun` and
`elasticrun status/drain/undrain/stop`.

Secrets never come from a flag's value: the etcd password from `--etcd-password-file` or
`$ELASTICRUN_ETCD_PASSWORD`, the job token from `--token-file` or `$ELASTICRUN_TOKEN`
(`elastic.driver.journal.job_token`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from elastic.driver.errors import UsageError
from elastic.driver.journal.job_token import TOKEN_VARIABLE, given_token
from elastic.driver.settings import BackendSettings
from elastic.protocol import env as worker_env
from elastic.protocol.etcd import DEFAULT_PREFIX, EtcdConfigError, EtcdOptions, parse_endpoints

log = logging.getLogger("elasticrun")

ETCD_PASSWORD_VARIABLE = "ELASTICRUN_ETCD_PASSWORD"


class FlagParser(argparse.ArgumentParser):
    """argparse that raises `UsageError` (one line, exit 2) instead of exiting itself."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    durable = parser.add_argument_group(
        "fault tolerance",
        "with --backend etcd the job's state outlives the driver: run the same command with "
        "the same --job-id again after the driver died, and it re-adopts the running workers",
    )
    durable.add_argument(
        "--backend",
        choices=("memory", "etcd"),
        default="memory",
        help="where the job's state lives (default memory: lost with the driver)",
    )
    durable.add_argument(
        "--job-id",
        metavar="ID",
        help="the job's name in the backend (default: a fresh random id, printed at start); "
        "letters, digits, '.', '_' and '-'",
    )
    add_etcd_flags(durable, "with --backend etcd")
    add_token_flag(durable)
    durable.add_argument(
        "--etcd-grace",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="an etcd outage longer than this is reported as an error (the job goes on from "
        "memory either way; default 60)",
    )
    durable.add_argument(
        "--driver-wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long workers keep trying to reach a restarted driver before they give up "
        "(--backend etcd; default 300)",
    )


def add_etcd_flags(group: argparse._ArgumentGroup | argparse.ArgumentParser, when: str) -> None:
    """The flags that reach etcd: its endpoints, the key prefix, TLS and a user (`when`:
    when the endpoints apply, for their help)."""
    group.add_argument("--etcd-endpoints", metavar="HOST:PORT,...", help=f"etcd servers ({when})")
    group.add_argument(
        "--etcd-prefix",
        default=DEFAULT_PREFIX,
        metavar="PREFIX",
        help=f"key prefix of every job's state in etcd (default {DEFAULT_PREFIX})",
    )
    group.add_argument(
        "--etcd-ca-cert",
        "--etcd-cacert",
        metavar="FILE",
        help="CA certificate of etcd: talk to etcd over TLS (workers need the file at the "
        "same path)",
    )
    group.add_argument("--etcd-cert", metavar="FILE", help="client certificate for etcd")
    group.add_argument("--etcd-key", metavar="FILE", help="client key for etcd")
    group.add_argument(
        "--etcd-user",
        metavar="USER",
        help=f"etcd user; its password from --etcd-password-file or ${ETCD_PASSWORD_VARIABLE} "
        "(never a flag's value)",
    )
    group.add_argument(
        "--etcd-password-file",
        metavar="FILE",
        help="file whose first line is the --etcd-user's password",
    )


def add_token_flag(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """`--token-file`: the job token, which etcd does not hold."""
    group.add_argument(
        "--token-file",
        metavar="FILE",
        help="the job's token (first line; a job file also works): what a driver taking an "
        f"etcd job up, or a command reaching its driver through etcd, needs; also "
        f"${TOKEN_VARIABLE}. Default: this host's job file, else a prompt at a terminal. A "
        "new job takes it as its token (32+ characters) instead of making one",
    )


def etcd_password(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The etcd password: the first line of `--etcd-password-file`, else
    `$ELASTICRUN_ETCD_PASSWORD`, else `$ELASTIC_ETCD_PASSWORD` (the name workers get it by,
    which earlier versions read); None without `--etcd-user`. Raises `UsageError` for a file
    that cannot be read, or given without `--etcd-user`."""
    path = args.etcd_password_file
    if path is not None and args.etcd_user is None:
        raise UsageError("--etcd-password-file needs --etcd-user")
    if args.etcd_user is None:
        return None
    if path is not None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as err:
            raise UsageError(
                f"--etcd-password-file {path}: cannot read it: {err.strerror or err}"
            ) from None
        return lines[0] if lines else ""
    return environ.get(ETCD_PASSWORD_VARIABLE) or environ.get(worker_env.ETCD_PASSWORD)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def etcd_options(
    args: argparse.Namespace,
    wanted: bool | None = None,
    environ: Mapping[str, str] = os.environ,
) -> EtcdOptions | None:
    """The etcd options given, or None when etcd is not `wanted` (default: when --backend is
    not etcd); raises `UsageError` for flags that need etcd, missing endpoints or files,
    endpoints that do not parse, a password file that cannot be read. `BackendSettings`
    checks the rest. Warns once when a password would cross the network without TLS."""
    flags = (
        "etcd_endpoints", "etcd_ca_cert", "etcd_cert", "etcd_key", "etcd_user",
        "etcd_password_file",
    )  # fmt: skip
    needs = "--backend etcd" if wanted is None else "--etcd-endpoints"
    if not (args.backend == "etcd" if wanted is None else wanted):
        for flag in flags:
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs {needs}")
        return None
    if not args.etcd_endpoints:
        raise UsageError("--backend etcd needs --etcd-endpoints HOST:PORT[,HOST:PORT...]")
    password = etcd_password(args, environ)
    for flag in ("etcd_ca_cert", "etcd_cert", "etcd_key"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"--{flag.replace('_', '-')}: no such file {path}")
    try:
        endpoints = parse_endpoints(args.etcd_endpoints)
    except EtcdConfigError as err:
        raise UsageError(f"--etcd-endpoints: {err}") from None
    if password and args.etcd_ca_cert is None and not all(_loopback(h) for h, _ in endpoints):
        log.warning(
            "the etcd password crosses the network in clear: give etcd's CA with "
            "--etcd-cacert to talk to it over TLS"
        )
    # Absolute paths: workers start elsewhere, and read the same paths on their hosts.
    files = {
        name: os.path.abspath(path) if path is not None else None
        for name, path in (
            ("ca_cert", args.etcd_ca_cert), ("cert", args.etcd_cert), ("key", args.etcd_key)
        )
    }  # fmt: skip
    return EtcdOptions(
        endpoints=endpoints,
        prefix=args.etcd_prefix,
        user=args.etcd_user,
        password=password,
        **files,
    )


def backend_settings(args: argparse.Namespace) -> BackendSettings:
    """The backend flags as `BackendSettings`, which check their values (`SettingsError`)."""
    return BackendSettings(
        etcd=etcd_options(args),
        job_id=args.job_id,
        grace=args.etcd_grace,
        driver_wait=args.driver_wait,
        token=given_token(args.token_file, os.environ),
    )
