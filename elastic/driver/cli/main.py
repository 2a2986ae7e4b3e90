"""`elasticrun`: the command line read into `Settings` (flags, `ELASTICRUN_*` variables, the
config file), checked, and the job run; `elasticrun status` and the other job commands go to
`job_commands.py`. The flags themselves are `launcher_flags.py`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
from collections.abc import Mapping

from elastic.driver.cli.backend_flags import backend_settings
from elastic.driver.cli.config_file import config_flags, read_config_file
from elastic.driver.cli.flag_sources import (
    FlagValues,
    flag_actions,
    flag_name,
    from_environment,
    layered_defaults,
    unknown_variables_warning,
)
from elastic.driver.cli.job_commands import COMMANDS, job_command_main
from elastic.driver.cli.launcher_flags import build_parser
from elastic.driver.descriptors import raise_open_file_limit
from elastic.driver.discovery import DiscoveryError, ScriptDiscovery
from elastic.driver.discovery.hosts import HostSpec, parse_host_list, read_hostfile
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.logs import HeldLines, launcher_formatter, tags
from elastic.driver.server.tls import TlsIdentity
from elastic.driver.settings import (
    DEFAULT_STANDBY,
    MAX_NP,
    ElasticSettings,
    FailureScope,
    Rollback,
    Settings,
)
from elastic.protocol.env import CheckpointSettings
from elastic.protocol.python_command import standby_command

log = logging.getLogger("elasticrun")


def _checkpoint_settings(args: argparse.Namespace) -> CheckpointSettings:
    """The durable-commit flags; a local directory is made absolute (workers start elsewhere)."""
    directory = args.checkpoint_dir or ""
    if directory and "://" not in directory:
        directory = os.path.abspath(directory)
    every, keep, interval = args.checkpoint_every, args.checkpoint_keep, args.checkpoint_interval
    if every < 1 or keep < 1:
        raise UsageError(f"--checkpoint-every ({every}) and --checkpoint-keep ({keep}) must be 1+")
    if not 0 <= interval < float("inf"):
        raise UsageError(f"--checkpoint-interval must be 0 or more seconds, got {interval}")
    return CheckpointSettings(directory, every, interval, keep, args.checkpoint_trust_pickles)


def parse_args(
    argv: list[str], environ: Mapping[str, str]
) -> tuple[argparse.Namespace, FlagValues]:
    """The flags from the command line, the `ELASTICRUN_*` variables of `environ` and the
    `--config-file`, in that order of precedence, and where each value not from the command
    line came from. Warns once about unknown `ELASTICRUN_*` variables and about horovodrun
    settings in the config file that elasticrun ignores."""
    parser = build_parser()
    environment, unknown = from_environment(parser, environ)
    if unknown:
        log.warning("%s", unknown_variables_warning(parser, unknown))
    layers = [environment]
    given = parser.parse_args(argv).config_file or environment.values.get("config_file")
    if given:
        file_flags, ignored = config_flags(parser, given, read_config_file(given))
        if ignored:
            log.warning(
                "config file %s: ignoring horovodrun settings elasticrun has no use for: %s",
                given,
                ", ".join(ignored),
            )
        layers.append(file_flags)
    defaults = layered_defaults(parser, argv, layers)
    parser.set_defaults(**defaults.values)
    return parser.parse_args(argv), defaults


def _name_sources(err: UsageError, sources: FlagValues) -> UsageError:
    """`err` with the sources named of the flags it mentions that came from the environment or
    the config file: a range check names the flag, the user looks for the variable."""
    actions = {action.dest: action for action in flag_actions(build_parser()).values()}
    notes = []
    for dest, source in sources.sources.items():
        options = actions[dest].option_strings
        if any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", str(err)) for o in options):
            notes.append(f"{flag_name(actions[dest])} from {source}")
    return UsageError(f"{err} ({'; '.join(notes)})") if notes else err


def parse_settings(argv: list[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Turn the command line, the `ELASTICRUN_*` variables of `environ` (default: this
    process's environment) and the config file into `Settings`; raise `UsageError` with one
    clear line, which names the variable or config-file key of a flag it refuses.

    The settings check their own values (`SettingsError`, a `UsageError`); what needs the
    world (the discovery script, key and certificate files) is checked after them, and the
    output folder is made last, once everything else is good."""
    args, sources = parse_args(argv, os.environ if environ is None else environ)
    try:
        return _settings(args)
    except UsageError as err:
        raise _name_sources(err, sources) from None


def _settings(args: argparse.Namespace) -> Settings:
    """`parse_settings` once the flags are read."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    elastic = _elastic_settings(args, command)
    if elastic is not None and elastic.discovery_script and (args.hosts or args.hostfile):
        raise UsageError("--host-discovery-script cannot be combined with -H or --hostfile")
    hosts: list[HostSpec]
    if args.hosts is not None:
        hosts = parse_host_list(args.hosts)
    elif args.hostfile is not None:
        hosts = read_hostfile(args.hostfile)
    else:
        default = args.np or (elastic.max_np if elastic and elastic.max_np else None) or 1
        hosts = [HostSpec("localhost", max(default, elastic.min_np if elastic else 1))]
    settings = Settings(
        np=args.np,
        hosts=hosts,
        command=command,
        ssh=SshOptions(
            port=args.ssh_port,
            identity_file=args.ssh_identity_file,
            connect_timeout=args.start_timeout,
        ),
        output_dir=args.output_filename,
        start_timeout=args.start_timeout,
        network_interface=args.network_interface,
        verbose=args.verbose,
        stop_grace=args.stop_grace,
        collective_timeout=args.collective_timeout,
        heartbeat_interval=args.heartbeat_interval,
        elastic=elastic,
        backend=backend_settings(args),
        tls=args.tls or args.tls_cert is not None,
        tls_cert=os.path.abspath(args.tls_cert) if args.tls_cert else None,
        tls_key=os.path.abspath(args.tls_key) if args.tls_key else None,
        allowed_hosts=_allowed_hosts(args.allowed_hosts),
        checkpoint=_checkpoint_settings(args),
        preemption_check=args.preemption_check or "",
        preemption_check_interval=args.preemption_check_interval,
        stall_warning=args.stall_warning,
        stall_timeout=args.stall_timeout,
        log_format=args.log_format,
        worker_history=args.worker_history,
    )
    if elastic is not None and elastic.discovery_script is not None:
        try:
            ScriptDiscovery(elastic.discovery_script, 1.0).check()
        except DiscoveryError as err:
            raise UsageError(f"--host-discovery-script: {err}") from None
    if args.ssh_identity_file and not os.path.isfile(args.ssh_identity_file):
        raise UsageError(f"--ssh-identity-file: no such file {args.ssh_identity_file}")
    if settings.tls_cert is not None and settings.tls_key is not None:
        TlsIdentity.load(settings.tls_cert, settings.tls_key)  # one clear line now, not at launch
    if settings.output_dir is not None:  # last: every other flag is good, so it is wanted
        prepare_output_dir(settings.output_dir)
    return settings


def _allowed_hosts(text: str | None) -> tuple[str, ...]:
    """`--allowed-hosts a,b:8443` as its entries (checked by `Settings`)."""
    return tuple(entry.strip() for entry in text.split(",")) if text is not None else ()


def prepare_output_dir(path: str) -> None:
    """Create `path` (for `--output-filename`) and check that rank folders and files can be
    made in it; raise `UsageError` with one line when they cannot (a file in the way, a
    read-only or pseudo file system such as /proc, no permission)."""
    try:
        os.makedirs(path, exist_ok=True)
        checks = tempfile.TemporaryDirectory(prefix=".elasticrun-check-", dir=path)
        with checks as probe, open(os.path.join(probe, "stdout"), "ab"):
            pass
    except OSError as err:
        raise UsageError(
            f"--output-filename {path}: cannot write rank output there: {err.strerror or err}"
        ) from None


def _elastic_settings(args: argparse.Namespace, command: list[str]) -> ElasticSettings | None:
    """The elastic flags as `ElasticSettings`, or None outside elastic mode. Their values are
    checked either way: a bad --elastic-timeout is a mistake even where it does not apply."""
    elastic = args.host_discovery_script is not None or args.min_np is not None
    if not elastic:
        for flag in ("max_np", "slots_per_host", "reset_limit", "failure_scope", "standby",
                     "preload"):  # fmt: skip
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise UsageError(f"{name} needs elastic mode (--min-np or --host-discovery-script)")
    low, high = args.blacklist_cooldown_range
    settings = ElasticSettings(
        # -np by default, when it is a count at all (`Settings` reports a bad -np by its name)
        min_np=args.min_np if args.min_np is not None else min(max(args.np or 1, 1), MAX_NP),
        max_np=args.max_np,
        discovery_script=args.host_discovery_script,
        slots_per_host=args.slots_per_host,
        discovery_interval=args.discovery_interval,
        discovery_timeout=args.discovery_timeout,
        elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit,
        cooldown_range=(low, high),
        failure_scope=FailureScope(args.failure_scope or FailureScope.HOST),
        rollback=Rollback(args.rollback),
        standby=_standby(args.standby, command) if elastic else 0,
        preload=tuple(name.strip() for name in (args.preload or "").split(",") if name.strip()),
    )
    if settings.preload and not settings.standby:
        raise UsageError("--preload needs standbys (--standby 1 or more)")
    return settings if elastic else None


def _standby(given: int | None, command: list[str]) -> int:
    """--standby's count: as given, else the default for a command a standby can run and 0
    for another. A count asked for a command no standby can run is an
    error, in one line."""
    if standby_command(command) is not None:
        return given if given is not None else DEFAULT_STANDBY
    if given:
        raise UsageError(
            f"--standby {given}: standbys run only a command that starts with python "
            f"(python script.py, python -m module, no -i or -x), not {shlex.join(command)!r}"
        )
    return 0  # the job says so once it starts (a refused command line says nothing more)


async def _run(settings: Settings, console: logging.Handler) -> int:
    # The driver (its HTTP, gRPC and heartbeat servers) is imported here, not at the top: it
    # is most of this module's import time, which `elasticrun status` and the like skip.
    from elastic.driver.job import Job

    raise_open_file_limit()  # before the ports take their shares of it
    job = Job.from_settings(settings)
    console.setFormatter(launcher_formatter(settings.log_format, job.current_round))
    if settings.backend.durable:
        log.info("job %s (state in etcd)", job.job_id)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, job.request_stop, sig)
    return await job.run()


def main(argv: list[str] | None = None) -> int:
    """Run the launcher (or a job command: `elasticrun status`, ...) and return its exit
    code. The launcher's lines go to stderr, timestamped, in --log-format once the flags are
    read; a refused command line, or a job that cannot start, is one `elasticrun: error: ...`
    line (a JSON object with --log-format json, for a job that cannot start)."""
    console = logging.StreamHandler()  # stderr
    console.setFormatter(launcher_formatter("text"))
    logging.basicConfig(handlers=[console], level=logging.WARNING)
    log.setLevel(logging.INFO)  # rounds, launches and leaves; --verbose adds the details
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:
        return job_command_main(argv[0], argv[1:])
    held = HeldLines(log)  # warnings about the flags wait for --log-format
    try:
        settings = parse_settings(argv)
        console.setFormatter(launcher_formatter(settings.log_format))
    except UsageError as err:
        held.show()
        print(f"elasticrun: error: {err}", file=sys.stderr)
        return 2
    finally:
        held.show()
    if settings.verbose:
        log.setLevel(logging.DEBUG)
    try:
        return asyncio.run(_run(settings, console))
    except UsageError as err:
        print(f"elasticrun: error: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        if settings.log_format == "json":
            log.error("error: %s", err, extra=tags("end"))
        else:
            print(f"elasticrun: error: {err}", file=sys.stderr)
        return 1
