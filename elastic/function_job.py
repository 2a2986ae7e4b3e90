"""`elastic.run_job`: run a Python function on every rank of an `elasticrun` job and get each
rank's return value back, as `horovod.run` does: for notebooks and frameworks that launch from
Python.

`run_job(fn, args, kwargs, np=..., ...)` pickles `(fn, args, kwargs)` (with cloudpickle when it
is installed, so lambdas and functions defined in a notebook travel by value; else with pickle,
by reference) into a fresh directory only this user can read, and runs the real launcher,
`elasticrun`, as a child process with each keyword as its flag, and
`python -m elastic.function_worker DIR` as the training command. Each worker loads the function
from that directory (nothing is unpickled from the network), calls it (the function calls
`hvd.init()` itself when it uses collectives, as with `horovod.run`), and writes its return
value or traceback there; the launcher's output (every worker line tagged with its rank) is
copied to this process's `sys.stdout` and `sys.stderr`, so a notebook shows it.

The directory must be at the same path on every host: the default, a temporary directory on
this machine, serves local hosts; with remote hosts give `shared_dir`, a directory on a
file system every host mounts (a remote worker that cannot find the function says so and
fails).
"""

from __future__ import annotations

import collections
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, TextIO

from elastic.driver.errors import UsageError
from elastic.driver.logs import launcher_line
from elastic.errors import ElasticError
from elastic.function_worker import FUNCTION_FILE, dumps


class JobFailedError(ElasticError, RuntimeError):
    """`run_job`'s job ended without a value from every rank. `tracebacks` holds, by rank, the
    traceback text of each rank whose function raised (or whose value could not be pickled);
    `exit_code` is the launcher's exit code (0 when it succeeded but values are missing)."""

    def __init__(self, message: str, exit_code: int, tracebacks: Mapping[int, str]) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.tracebacks = dict(tracebacks)


def launcher_flags(flags: Mapping[str, Any]) -> list[str]:
    """`elasticrun` flags from keywords: `min_np=2` is `--min-np=2`, `tls=True` is `--tls`,
    `False` and `None` leave a flag out, a tuple or list gives several values
    (`blacklist_cooldown_range=(0, 0)`)."""
    argv: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            argv += [flag, *map(str, value)]
        else:
            argv.append(f"{flag}={value}")
    return argv


def run_job(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    np: int | None = None,
    hosts: str | Iterable[str] | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    discovery: str | None = None,
    shared_dir: str | None = None,
    **flags: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` in every worker of an `elasticrun` job; return the values, by
    rank (a list of `size` values).

    `np`, `hosts` ("host:slots,..." or a list of "host:slots"), `min_np`, `max_np` and
    `discovery` (a host discovery script) are `-np`, `-H`, `--min-np`, `--max-np` and
    `--host-discovery-script`; any other launcher flag is a keyword of the same name
    (`start_timeout=10`, `verbose=True`, `config_file="job.yaml"`). Keywords win over
    `ELASTICRUN_*` variables and the config file, as the command line does. In an elastic job
    the values are those of the ranks of the last round (a worker that left returns none).

    Raises `JobFailedError` when the function raised on any rank (the message holds each such
    rank's traceback text, even where an elastic job went on without that worker), when the
    job failed, or when a rank's value is missing; `UsageError` (an `ElasticError`) with
    `elasticrun`'s message when it refused the flags. On KeyboardInterrupt (or any exception
    here) the launcher is stopped, and with it every worker, before the exception propagates.
    """
    host_list = hosts if isinstance(hosts, str | None) else ",".join(hosts)
    given = {"num_proc": np, "hosts": host_list, "min_np": min_np, "max_np": max_np}
    argv = launcher_flags({**given, "host_discovery_script": discovery, **flags})
    directory = tempfile.mkdtemp(prefix="elastic-run-job-", dir=shared_dir)
    try:
        with open(os.path.join(directory, FUNCTION_FILE), "wb") as file:
            file.write(dumps((fn, tuple(args), dict(kwargs or {}))))
        command = [sys.executable, "-m", "elastic.function_worker", directory]
        code, said = _run_launcher([*argv, "--", *command])
        return _outcome(directory, code, said)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_launcher(argv: list[str]) -> tuple[int, list[str]]:
    """Run `elasticrun argv`, copying its output here; return its exit code and its last lines
    of its own (`elasticrun: ...`). Stops it (SIGTERM: it stops its workers) if interrupted."""
    process = subprocess.Popen(
        [sys.executable, "-m", "elastic.driver.cli", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,  # stopped by us, with its workers, not by the terminal's ^C
    )
    said: collections.deque[str] = collections.deque(maxlen=20)
    copiers = [
        threading.Thread(target=_copy, args=(process.stdout, sys.stdout, None), daemon=True),
        threading.Thread(target=_copy, args=(process.stderr, sys.stderr, said), daemon=True),
    ]
    for copier in copiers:
        copier.start()
    try:
        process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for copier in copiers:
            copier.join(timeout=5)
    return process.returncode, list(said)


def _copy(source: IO[str] | None, target: TextIO, said: collections.deque[str] | None) -> None:
    """Copy `source` line by line to `target` (flushed: a notebook shows it at once), keeping
    the launcher's own lines in `said` (as `elasticrun: message`, without a timestamp)."""
    assert source is not None
    for line in source:
        target.write(line)
        target.flush()
        if said is not None and (own := launcher_line(line.rstrip("\n"))) is not None:
            said.append(own)


def _outcome(directory: str, code: int, said: list[str]) -> list[Any]:
    """The values by rank from the workers' files in `directory`, or the error to raise."""
    tracebacks: dict[int, str] = {}
    results: dict[int, tuple[int, Any]] = {}
    for name in os.listdir(directory):
        kind, _, rank = name.partition(".")
        if kind not in ("error", "result") or not rank.isdigit():
            continue
        with open(os.path.join(directory, name), "rb") as file:
            if kind == "error":
                tracebacks[int(rank)] = file.read().decode(errors="replace")
            else:
                results[int(rank)] = pickle.load(file)  # written by our workers, user-only dir
    if tracebacks:
        texts = "\n".join(f"rank {r} raised:\n{t}" for r, t in sorted(tracebacks.items()))
        message = f"the function raised on rank(s) {sorted(tracebacks)}:\n{texts}"
        raise JobFailedError(message, code, tracebacks)
    usage = [line for line in said if line.startswith("elasticrun: error: ")]
    if code == 2 and usage:
        raise UsageError(usage[-1].removeprefix("elasticrun: error: "))
    if code != 0:
        last = said[-1] if said else "no message"
        raise JobFailedError(f"the job failed with exit code {code}: {last}", code, {})
    sizes = {size for size, _ in results.values()}
    size = sizes.pop() if len(sizes) == 1 else -1
    if size < 0 or sorted(results) != list(range(size)):
        found = {rank: size for rank, (size, _) in sorted(results.items())}
        raise JobFailedError(f"values missing: ranks found (with their size): {found}", code, {})
    return [results[rank][1] for rank in range(size)]
