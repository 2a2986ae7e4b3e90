"""The launcher's flags (`elasticrun [flags] COMMAND`), with horovodrun's names and meaning,
built one group at a time: each `_add_*` function adds one group, in the order `--help` lists
them. Where a flag's value may also come from is `flag_sources.py`; the state backend's flags
are `backend_flags.py`, shared with the job commands.
"""

from __future__ import annotations

import argparse

from elastic.driver.cli.backend_flags import FlagParser, add_backend_flags
from elastic.driver.logs import LOG_FORMATS
from elastic.driver.settings import (
    DEFAULT_STANDBY,
    DEFAULT_WORKER_HISTORY,
    FailureScope,
    Rollback,
)

EXAMPLES = """\
examples:
  elasticrun -np 2 python train.py
  elasticrun -np 4 -H host1:2,host2:2 python train.py
  elasticrun -np 8 --hostfile hosts.txt --output-filename logs/ python train.py
  elasticrun -np 2 --min-np 1 --max-np 8 --host-discovery-script ./hosts.sh python train.py
  elasticrun --backend etcd --etcd-endpoints 10.0.0.5:2379 --job-id run7 -np 4 python train.py
  elasticrun status                  (the job this user runs here; --job-id ID for one of several)
  elasticrun drain host2             (its workers leave at their next step; undrain gives it back)
  elasticrun stop
  elasticrun status --job-id run7 --etcd-endpoints 10.0.0.5:2379
  ELASTICRUN_MIN_NP=2 elasticrun --config-file job.yaml python train.py

Every flag --some-flag can also be given as the environment variable ELASTICRUN_SOME_FLAG or as
the key some-flag (or some_flag) of the YAML --config-file; the command line wins over the
environment, which wins over the file.
"""


def build_parser() -> argparse.ArgumentParser:
    """The launcher's parser: every flag group in `--help`'s order, then the command."""
    parser = FlagParser(
        prog="elasticrun",
        description="Launch a data-parallel PyTorch job: one worker process per slot.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for add_group in (
        _add_placement_flags,
        _add_ssh_flags,
        _add_output_dir_flag,
        _add_start_flags,
        _add_liveness_flags,
        _add_elastic_flags,
        _add_security_flags,
        _add_durable_flags,
        add_backend_flags,
        _add_log_flags,
        _add_config_file_flag,
    ):
        add_group(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return parser


def _add_placement_flags(parser: argparse.ArgumentParser) -> None:
    """How many workers, on which hosts."""
    parser.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=int,
        metavar="N",
        help="number of worker processes (elastic: how many slots to wait for before the "
        "first round, which takes every offered slot up to --max-np; default --min-np)",
    )
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H",
        "--hosts",
        metavar="HOST:SLOTS,...",
        help="hosts and their slot counts, filled in this order (default: localhost:N)",
    )
    hosts.add_argument(
        "--hostfile",
        metavar="FILE",
        help="file with one 'host:slots' or 'host slots=N' per line",
    )


def _add_ssh_flags(parser: argparse.ArgumentParser) -> None:
    """How remote hosts are reached."""
    parser.add_argument(
        "-p", "--ssh-port", type=int, metavar="PORT", help="ssh port of remote hosts"
    )
    parser.add_argument(
        "-i", "--ssh-identity-file", metavar="FILE", help="ssh private key for remote hosts"
    )


def _add_output_dir_flag(parser: argparse.ArgumentParser) -> None:
    """Where each rank's output is also written."""
    parser.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<N>/stdout and stderr",
    )


def _add_start_flags(parser: argparse.ArgumentParser) -> None:
    """How long a start may take, and where the driver serves."""
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="time for ssh hosts to answer and workers to join the rendezvous (default 30)",
    )
    parser.add_argument(
        "--network-interface",
        metavar="IF",
        help="interface whose address the driver serves on (default: loopback when all hosts "
        "are local, else the address that routes to the first remote host)",
    )


def _add_liveness_flags(parser: argparse.ArgumentParser) -> None:
    """How a hung or dead worker is noticed and stopped."""
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="timeout of one collective operation in the workers (default 1800)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when workers are stopped (default 5)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="workers send a heartbeat this often; one that misses 3 is declared dead and "
        "killed (default 1)",
    )
    parser.add_argument(
        "--stall-warning",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="when ranks of a round have waited this long in one collective for others that "
        "are not in it, log a line naming the ranks behind and what each does (default 60)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="when ranks have waited this long for others, the ranks behind have failed: they "
        "are killed and the job re-forms without them (default: never)",
    )


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    """Elastic mode: discovery, the worker-count range, cooldown and preemption."""
    elastic = parser.add_argument_group(
        "elastic mode", "on when --host-discovery-script or --min-np is given"
    )
    elastic.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="executable printing the available hosts, one 'host' or 'host:slots' a line",
    )
    elastic.add_argument(
        "--min-np",
        type=int,
        metavar="N",
        help="fewest workers the job trains with (default: -np, or 1)",
    )
    elastic.add_argument(
        "--max-np", type=int, metavar="N", help="most workers (default: every usable slot)"
    )
    elastic.add_argument(
        "--slots-per-host",
        type=int,
        metavar="N",
        help="slots of a discovered host printed without a count (default 1)",
    )
    elastic.add_argument(
        "--elastic-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long the job may have fewer than --min-np workers before it fails (default 600)",
    )
    elastic.add_argument(
        "--reset-limit",
        type=int,
        metavar="N",
        help="fail the job after N re-rendezvous (default: no limit)",
    )
    elastic.add_argument(
        "--blacklist-cooldown-range",
        type=float,
        nargs=2,
        default=(5.0, 300.0),
        metavar=("MIN", "MAX"),
        help="a host whose worker failed gets no new worker for MIN seconds, doubling with "
        "each failure up to MAX, with jitter (default 5 300; 0 0 turns cooldown off)",
    )
    elastic.add_argument(
        "--failure-scope",
        choices=[scope.value for scope in FailureScope],
        metavar="host|worker",
        help="what a failed worker takes out of the job: 'host', its host's other workers "
        "too, as horovodrun does (a GPU or host fault); 'worker', itself alone, its host's "
        "other workers going on (an out-of-memory kill) (default host)",
    )
    elastic.add_argument(
        "--rollback",
        choices=[way.value for way in Rollback],
        default=Rollback.STEP.value,
        metavar="step|commit",
        help="where the survivors go on from when a worker dies: 'step', the newest optimizer "
        "step every survivor completed (or one of them, whose state the others take), so a "
        "failure costs only the step in flight; 'commit', their last commit, as Horovod "
        "does (default step; see docs/worker-api.md#no-rollback)",
    )
    elastic.add_argument(
        "--standby",
        type=int,
        metavar="N",
        help=f"warm standby processes per host that runs workers: each has imported torch and "
        f"the worker runtime and waits; a slot refilled on its host (a crashed worker's, a "
        f"joiner's) runs the script in it, so it trains within about a second; 0 turns them "
        f"off; only for a command that starts with python (default {DEFAULT_STANDBY}: off; "
        f"see docs/launcher.md#warm-standbys)",
    )
    elastic.add_argument(
        "--preload",
        metavar="MODULES",
        help="modules the standbys import too, comma-separated (torchvision,transformers): "
        "what the script imports that takes long (default: none)",
    )
    elastic.add_argument(
        "--discovery-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="run the discovery script this often (default 1)",
    )
    elastic.add_argument(
        "--preemption-check",
        metavar="CMD",
        help="a command each worker runs every --preemption-check-interval s; it prints when "
        "its host goes (Unix seconds or ISO 8601), or nothing: the host's workers then leave "
        "at their next step (see discovery_scripts/aws_spot_check.py, gcp_preemption_check.py)",
    )
    elastic.add_argument(
        "--preemption-check-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the preemption check runs; it is killed after this long, 10 s at "
        "most (default 5)",
    )
    elastic.add_argument(
        "--discovery-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="kill a discovery script that runs longer (default 10)",
    )


def _add_security_flags(parser: argparse.ArgumentParser) -> None:
    """TLS and the names the HTTP port answers to."""
    security = parser.add_argument_group("security")
    security.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS and TLS gRPC with a self-signed certificate made for this job; "
        "workers trust exactly that certificate",
    )
    security.add_argument(
        "--tls-cert", metavar="FILE", help="TLS certificate (PEM) to serve with (implies --tls)"
    )
    security.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    security.add_argument(
        "--allowed-hosts",
        metavar="NAME[:PORT],...",
        help="more names the HTTP port answers to in the Host header (a proxy, a DNS name), "
        "beside its own address, the machine's names and, on loopback, localhost; '*' lets "
        "every name through (default: none more)",
    )


def _add_durable_flags(parser: argparse.ArgumentParser) -> None:
    """Durable commits (`--checkpoint-dir`)."""
    durable = parser.add_argument_group(
        "durable commits",
        "commits written to a directory in the background by one worker, so that a job that "
        "lost every worker resumes from the newest one",
    )
    durable.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="directory or fsspec URL (s3://..., gs://...) the workers write to; every host "
        "must reach the same one (default: none, commits stay in memory)",
    )
    durable.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="N",
        help="write every N-th commit, while no write is in flight (default 1)",
    )
    durable.add_argument(
        "--checkpoint-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also write the first commit this long after the last write (default 0: never)",
    )
    durable.add_argument(
        "--checkpoint-keep",
        type=int,
        default=2,
        metavar="K",
        help="keep the newest K written commits (default 2)",
    )
    durable.add_argument(
        "--checkpoint-trust-pickles",
        action="store_true",
        help="let commits hold any picklable object and load checkpoints as full pickles, "
        "which run the code of whoever wrote them: only for a directory whose every writer "
        "you trust (default: tensors and plain values only, loaded with weights_only=True)",
    )


def _add_log_flags(parser: argparse.ArgumentParser) -> None:
    """What the launcher's lines say and how they look, and which ended workers it lists."""
    parser.add_argument("--verbose", action="store_true", help="log the driver's decisions")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="the launcher's lines: text (for people: a UTC timestamp, then 'elasticrun: ...'; "
        "workers' lines '[rank]<stdout>:...') or json (one object a line: time, level, round, "
        "rank, host, event, message; workers' lines also stream) (default text)",
    )
    parser.add_argument(
        "--worker-history",
        type=int,
        default=DEFAULT_WORKER_HISTORY,
        metavar="N",
        help="ended workers whose records the driver keeps and lists (status, page, saved "
        "state): the newest N; every ended worker is still counted by cause "
        f"(default {DEFAULT_WORKER_HISTORY})",
    )


def _add_config_file_flag(parser: argparse.ArgumentParser) -> None:
    """Flags from a YAML file."""
    parser.add_argument(
        "--config-file",
        metavar="FILE",
        help="YAML file of flags ('min-np: 2', a line each; horovodrun's sections are read where "
        "they mean one of these flags); the command line and ELASTICRUN_* variables win",
    )
