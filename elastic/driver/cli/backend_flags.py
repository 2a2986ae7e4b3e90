"""The flags that say where a job's state lives (`--backend`, `--etcd-*`, `--job-id`), shared
by `elasticrun` and `elasticrun status`."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from elastic.driver.errors import UsageError
from elastic.driver.settings import BackendSettings
from elastic.protocol import env as worker_env
from elastic.protocol.etcd import DEFAULT_PREFIX, EtcdConfigError, EtcdOptions, parse_endpoints


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
    group.add_argument("--etcd-ca-cert", metavar="FILE", help="CA certificate of etcd (TLS)")
    group.add_argument("--etcd-cert", metavar="FILE", help="client certificate for etcd")
    group.add_argument("--etcd-key", metavar="FILE", help="client key for etcd")
    group.add_argument(
        "--etcd-user",
        metavar="USER",
        help=f"etcd user; the password is read from ${worker_env.ETCD_PASSWORD}, never a flag",
    )


def etcd_options(args: argparse.Namespace, wanted: bool | None = None) -> EtcdOptions | None:
    """The etcd options given, or None when etcd is not `wanted` (default: when --backend is
    not etcd); raises `UsageError` for flags that need etcd, missing endpoints or files,
    endpoints that do not parse. `BackendSettings` checks the rest."""
    flags = ("etcd_endpoints", "etcd_ca_cert", "etcd_cert", "etcd_key", "etcd_user")
    needs = "--backend etcd" if wanted is None else "--etcd-endpoints"
    if not (args.backend == "etcd" if wanted is None else wanted):
        for flag in flags:
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs {needs}")
        return None
    if not args.etcd_endpoints:
        raise UsageError("--backend etcd needs --etcd-endpoints HOST:PORT[,HOST:PORT...]")
    for flag in ("etcd_ca_cert", "etcd_cert", "etcd_key"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"--{flag.replace('_', '-')}: no such file {path}")
    password = os.environ.get(worker_env.ETCD_PASSWORD)
    try:
        endpoints = parse_endpoints(args.etcd_endpoints)
    except EtcdConfigError as err:
        raise UsageError(f"--etcd-endpoints: {err}") from None
    return EtcdOptions(
        endpoints=endpoints,
        prefix=args.etcd_prefix,
        ca_cert=args.etcd_ca_cert,
        cert=args.etcd_cert,
        key=args.etcd_key,
        user=args.etcd_user,
        password=password if args.etcd_user else None,
    )


def backend_settings(args: argparse.Namespace) -> BackendSettings:
    """The backend flags as `BackendSettings`, which check their values (`SettingsError`)."""
    return BackendSettings(
        etcd=etcd_options(args),
        job_id=args.job_id,
        grace=args.etcd_grace,
        driver_wait=args.driver_wait,
    )
