"""The environment the driver gives every worker process: the variables' names and
`WorkerEnvironment`, the only code that writes them (the driver, `to_env`) and reads them (the
worker, `from_env`). `slot_variables` names a slot's values, for the driver at launch and for
the worker runtime after each re-form.

They are documented in docs/launcher.md ("Worker environment"). The secret (`TOKEN`) is in the
environment of local children and read from ssh's stdin on remote hosts, never on a command
line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from elastic.errors import ElasticError
from elastic.protocol.etcd import EtcdConfigError, EtcdOptions, parse_endpoints
from elastic.protocol.http import SlotInfo

HOSTNAME = "ELASTIC_HOSTNAME"
RANK = "ELASTIC_RANK"
SIZE = "ELASTIC_SIZE"
LOCAL_RANK = "ELASTIC_LOCAL_RANK"
LOCAL_SIZE = "ELASTIC_LOCAL_SIZE"
CROSS_RANK = "ELASTIC_CROSS_RANK"
CROSS_SIZE = "ELASTIC_CROSS_SIZE"
DRIVER_URL = "ELASTIC_DRIVER_URL"
CONTROL_ADDRESS = "ELASTIC_CONTROL_ADDRESS"  # host:port of the gRPC control service
# With TLS: the driver's certificate (PEM) that workers pin as their only CA. Public, not secret.
TLS_CERT = "ELASTIC_TLS_CERT"
WORKER_ID = "ELASTIC_WORKER_ID"  # this worker process's id in the job, stable across rounds
ELASTIC = "ELASTIC_ELASTIC"  # "1" in an elastic job
JOB_ID = "ELASTIC_JOB_ID"
COLLECTIVE_TIMEOUT = "ELASTIC_COLLECTIVE_TIMEOUT"
ROLLBACK = "ELASTIC_ROLLBACK"
START_TIMEOUT = "ELASTIC_START_TIMEOUT"
ELASTIC_TIMEOUT = "ELASTIC_ELASTIC_TIMEOUT"  # how long the job may wait for --min-np workers
# With the etcd backend: where workers look up a restarted driver's address, and how long
# they wait for one.
ETCD_ENDPOINTS = "ELASTIC_ETCD_ENDPOINTS"
ETCD_PREFIX = "ELASTIC_ETCD_PREFIX"
ETCD_CA_CERT = "ELASTIC_ETCD_CA_CERT"
ETCD_CERT = "ELASTIC_ETCD_CERT"
ETCD_KEY = "ELASTIC_ETCD_KEY"
ETCD_USER = "ELASTIC_ETCD_USER"
ETCD_PASSWORD = "ELASTIC_ETCD_PASSWORD"  # also how the user gives it to elasticrun
DRIVER_WAIT = "ELASTIC_DRIVER_WAIT"
PREEMPTION_CHECK = "ELASTIC_PREEMPTION_CHECK"  # --preemption-check: a command line
PREEMPTION_CHECK_INTERVAL = "ELASTIC_PREEMPTION_CHECK_INTERVAL"
TOKEN = "ELASTIC_TOKEN"  # the job's secret
# A warm standby's (`elastic.worker.standby`): its id at the driver, the job's command (JSON)
# and the modules it imports before it waits (--preload, comma-separated).
STANDBY_ID = "ELASTIC_STANDBY_ID"
STANDBY_COMMAND = "ELASTIC_STANDBY_COMMAND"
STANDBY_PRELOAD = "ELASTIC_STANDBY_PRELOAD"
# Durable commits (--checkpoint-dir and its companions; see `CheckpointSettings`).
CHECKPOINT_DIR = "ELASTIC_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "ELASTIC_CHECKPOINT_EVERY"
CHECKPOINT_INTERVAL = "ELASTIC_CHECKPOINT_INTERVAL"
CHECKPOINT_KEEP = "ELASTIC_CHECKPOINT_KEEP"
CHECKPOINT_TRUST_PICKLES = "ELASTIC_CHECKPOINT_TRUST_PICKLES"  # "1": load full pickles

# Horovod's names, as horovodrun's Gloo launcher sets them, for scripts that read them: the
# same values as ELASTIC_HOSTNAME and the slot's ELASTIC_* variables.
HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"
HOROVOD_RANK = "HOROVOD_RANK"
HOROVOD_SIZE = "HOROVOD_SIZE"
HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"

AUTH_SCHEME = "Bearer"


class NotLaunchedError(ElasticError, RuntimeError):
    """The process was not started by `elasticrun`: the driver's address or token is missing."""


class WorkerEnvironmentError(ElasticError, ValueError):
    """A worker variable is set but unusable: a number that does not parse, an etcd endpoint
    that is not host:port, a slot given in part. The message names the variable."""


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often durable commits are written: every `every`-th commit, or the first
    commit `interval` seconds (0: no such bound) after the last write, whichever comes
    first, while no write is in flight; the newest `keep` are kept. `directory` is a path
    or an fsspec URL; empty: no durable commits. `trust_pickles`: checkpoints may hold any
    picklable value and are loaded as full pickles (`--checkpoint-trust-pickles`), trusting
    every writer of the directory. Each `State` reads these itself, so a state made in a
    process that `elasticrun` did not start takes them from its environment too.
    """

    directory: str = ""
    every: int = 1
    interval: float = 0.0
    keep: int = 2
    trust_pickles: bool = False

    def __post_init__(self) -> None:
        if self.every < 1 or self.keep < 1 or not 0 <= self.interval < float("inf"):
            raise ValueError(
                f"durable commits: every ({self.every}) and keep ({self.keep}) must be at "
                f"least 1, interval ({self.interval}) a number of seconds, 0 for none"
            )

    def to_env(self) -> dict[str, str]:
        """The variables that describe these settings (none without a directory)."""
        if not self.directory:
            return {}
        return {
            CHECKPOINT_DIR: self.directory,
            CHECKPOINT_EVERY: str(self.every),
            CHECKPOINT_INTERVAL: str(self.interval),
            CHECKPOINT_KEEP: str(self.keep),
            CHECKPOINT_TRUST_PICKLES: _write_flag(self.trust_pickles),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Self:
        """Read `to_env`'s variables; `WorkerEnvironmentError` names one that is unusable."""
        given: dict[str, Any] = {"directory": environ.get(CHECKPOINT_DIR, "")}
        for attribute, name, read in (
            ("every", CHECKPOINT_EVERY, int),
            ("interval", CHECKPOINT_INTERVAL, float),
            ("keep", CHECKPOINT_KEEP, int),
        ):
            if environ.get(name):
                given[attribute] = _parsed(environ, name, read)
        trust = environ.get(CHECKPOINT_TRUST_PICKLES, "")
        if trust not in ("", "0", "1"):
            raise WorkerEnvironmentError(f"{CHECKPOINT_TRUST_PICKLES}={trust!r} is not 0 or 1")
        given["trust_pickles"] = trust == "1"
        try:
            return cls(**given)
        except ValueError as err:
            raise WorkerEnvironmentError(f"{CHECKPOINT_DIR} and companions: {err}") from None


@dataclass(frozen=True)
class WorkerEnvironment:
    """What the driver tells a worker process through its environment.

    The defaults here are the only ones: a variable that is unset (or empty) takes its field's
    default. `WorkerEnvironment.from_env(w.to_env()) == w` for every `w` whose strings are not
    empty, but for two parts that are not sent: `etcd.call_timeout` (the worker's own) and
    `slot.hostname` (always `hostname`).
    """

    driver_url: str
    control_address: str  # host:port of the gRPC control service
    token: str = field(repr=False)  # the job's secret: never in a log line or traceback
    worker_id: str  # stable across rounds
    hostname: str  # the host name as given in -H, the hostfile or discovery
    job_id: str = ""
    elastic: bool = False
    start_timeout: float = 30.0  # seconds
    collective_timeout: float = 1800.0  # seconds one collective may take
    elastic_timeout: float = 600.0  # seconds the driver may wait for enough workers
    tls_cert: bytes | None = None  # the driver's certificate (PEM), pinned (TLS)
    etcd: EtcdOptions | None = None  # where a restarted driver publishes its address
    driver_wait: float = 300.0  # seconds to keep trying to reach a restarted driver (etcd)
    slot: SlotInfo | None = None  # its slot in round 1, when that formed before its launch
    checkpoint: CheckpointSettings = CheckpointSettings()  # durable commits (none by default)
    preemption_check: str = ""  # a command run every interval that prints when the host goes
    preemption_check_interval: float = 5.0  # seconds
    # after a peer dies: "step", the survivors go on from their consistent live state;
    # "commit", back to the last commit (--rollback)
    rollback: str = "step"

    def to_env(self) -> dict[str, str]:
        """The variables that describe this environment; a None or empty option sets none.
        `HOROVOD_HOSTNAME` is always set, the slot's variables (`slot_variables`) with a slot.
        """
        values = {name: write(getattr(self, attribute)) for attribute, name, write, _ in _SCALARS}
        values[HOROVOD_HOSTNAME] = self.hostname
        if self.etcd is not None:
            values[ETCD_ENDPOINTS] = ",".join(f"{h}:{p}" for h, p in self.etcd.endpoints)
            values.update({name: getattr(self.etcd, key) or None for key, name in _ETCD})
        if self.slot is not None:
            values.update(slot_variables(self.slot))
        values.update(self.checkpoint.to_env())
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Self:
        """Read the variables `to_env` writes from `environ`.

        Raises `NotLaunchedError` when the driver's address, the token, the worker's id or
        its host is missing (the process was not started by `elasticrun`), and
        `WorkerEnvironmentError` naming the variable when a value cannot be used.
        """
        missing = [name for name in _REQUIRED if not environ.get(name)]
        if missing:
            raise NotLaunchedError(
                "elastic.torch.init(): this process was not started by elasticrun "
                f"({', '.join(missing)} not set); run it as `elasticrun -np N python script.py`"
            )
        given = {
            attribute: _parsed(environ, name, read, _WHAT.get(name, "a number"))
            for attribute, name, _, read in _SCALARS
            if environ.get(name)
        }
        return cls(
            **given,
            etcd=_etcd_from(environ),
            slot=_slot_from(environ, given["hostname"]),
            checkpoint=CheckpointSettings.from_env(environ),
        )


_WHAT = {ROLLBACK: "'step' or 'commit'"}
"""What a variable read by `_SCALARS` must be, where it is not a number."""
_REQUIRED = (DRIVER_URL, CONTROL_ADDRESS, TOKEN, WORKER_ID, HOSTNAME)
"""What `WorkerEnvironment.from_env` cannot do without."""


def _write_flag(value: bool) -> str:
    return "1" if value else "0"


def _read_flag(text: str) -> bool:
    return text == "1"


def _write_text(value: str) -> str | None:
    return value or None


def _write_pem(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _read_rollback(text: str) -> str:
    if text not in ("step", "commit"):
        raise ValueError(f"{text!r} is neither 'step' nor 'commit'")
    return text


def _read_pem(text: str) -> bytes:
    return text.encode(errors="surrogateescape")


_SCALARS: tuple[tuple[str, str, Callable[[Any], str | None], Callable[[str], Any]], ...] = (
    ("driver_url", DRIVER_URL, str, str),
    ("control_address", CONTROL_ADDRESS, str, str),
    ("token", TOKEN, str, str),
    ("worker_id", WORKER_ID, str, str),
    ("hostname", HOSTNAME, str, str),
    ("job_id", JOB_ID, str, str),
    ("elastic", ELASTIC, _write_flag, _read_flag),
    ("start_timeout", START_TIMEOUT, str, float),
    ("collective_timeout", COLLECTIVE_TIMEOUT, str, float),
    ("elastic_timeout", ELASTIC_TIMEOUT, str, float),
    ("tls_cert", TLS_CERT, _write_pem, _read_pem),
    ("driver_wait", DRIVER_WAIT, str, float),
    ("preemption_check", PREEMPTION_CHECK, _write_text, str),
    ("preemption_check_interval", PREEMPTION_CHECK_INTERVAL, str, float),
    ("rollback", ROLLBACK, str, _read_rollback),
)
"""(field, variable, how it is written, how it is read) of each plain `WorkerEnvironment`
field. Only the numbers' and the rollback's readers raise `ValueError`."""
_ETCD = (
    ("prefix", ETCD_PREFIX),
    ("ca_cert", ETCD_CA_CERT),
    ("cert", ETCD_CERT),
    ("key", ETCD_KEY),
    ("user", ETCD_USER),
    ("password", ETCD_PASSWORD),
)
"""(field, variable) of the `EtcdOptions` sent besides the endpoints."""
_SLOT = (
    ("rank", RANK),
    ("size", SIZE),
    ("local_rank", LOCAL_RANK),
    ("local_size", LOCAL_SIZE),
    ("cross_rank", CROSS_RANK),
    ("cross_size", CROSS_SIZE),
)
"""(field, variable) of the `SlotInfo` sent, its hostname aside."""
_HOROVOD_SLOT = (
    ("rank", HOROVOD_RANK),
    ("size", HOROVOD_SIZE),
    ("local_rank", HOROVOD_LOCAL_RANK),
    ("local_size", HOROVOD_LOCAL_SIZE),
    ("cross_rank", HOROVOD_CROSS_RANK),
    ("cross_size", HOROVOD_CROSS_SIZE),
)
"""(field, variable) of the same values under Horovod's names."""
SLOT_VARIABLES = frozenset(name for _, name in _SLOT + _HOROVOD_SLOT)
"""The variables that hold a rank: a worker that has none must not inherit them."""


def slot_variables(slot: SlotInfo) -> dict[str, str]:
    """The variables that describe `slot`: `ELASTIC_RANK` ... `ELASTIC_CROSS_SIZE` and
    Horovod's `HOROVOD_RANK` ... `HOROVOD_CROSS_SIZE` with the same values, and
    `HOROVOD_HOSTNAME`."""
    values = {name: str(getattr(slot, key)) for key, name in _SLOT + _HOROVOD_SLOT}
    values[HOROVOD_HOSTNAME] = slot.hostname
    return values


def _parsed(
    environ: Mapping[str, str], name: str, read: Callable[[str], Any], what: str = "a number"
) -> Any:
    text = environ[name]
    try:
        return read(text)
    except ValueError:
        raise WorkerEnvironmentError(f"{name}={text!r} is not {what}") from None


def _etcd_from(environ: Mapping[str, str]) -> EtcdOptions | None:
    endpoints = environ.get(ETCD_ENDPOINTS)
    if not endpoints:
        return None
    try:
        parsed = parse_endpoints(endpoints)
    except EtcdConfigError as err:
        raise WorkerEnvironmentError(f"{ETCD_ENDPOINTS}: {err}") from None
    given = {attribute: environ[name] for attribute, name in _ETCD if environ.get(name)}
    return EtcdOptions(endpoints=parsed, **given)


def _slot_from(environ: Mapping[str, str], hostname: str) -> SlotInfo | None:
    given = [name for _, name in _SLOT if environ.get(name)]
    if not given:
        return None
    if len(given) < len(_SLOT):
        missing = ", ".join(name for _, name in _SLOT if name not in given)
        raise WorkerEnvironmentError(f"{', '.join(given)} set without {missing}")
    numbers = {attr: _parsed(environ, name, int, "a whole number") for attr, name in _SLOT}
    return SlotInfo(hostname=hostname, **numbers)
