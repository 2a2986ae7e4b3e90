"""The worker side of `elastic.run_job`: `python -m elastic.function_worker DIR`.

Reads `DIR/function.pkl` (written by `run_job` in a directory only its user can read, never
received from the network), calls the function, and leaves its outcome in `DIR`:
`result.<rank>`, a pickle of `(size, value)` with this worker's rank and the job's size in the
round it ended in (`hvd.rank()`/`hvd.size()` when the function called `hvd.init()`, else the
launch environment's), or `error.<rank>`, the traceback's text, when loading or calling the
function or pickling its value raised (the worker then exits 1). A worker that leaves an
elastic job (`SystemExit(0)` from `hvd.elastic.run`) leaves nothing. Each file appears whole
(written aside, then renamed).

Like `horovod.run`, this does not call `hvd.init()`: the function does, when it needs to.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from typing import Any

from elastic.protocol import env

FUNCTION_FILE = "function.pkl"
"""The pickled `(fn, args, kwargs)` in the job's directory, written by `elastic.run_job`."""


def _place() -> tuple[int, int]:
    """This worker's (rank, size): the current round's where `hvd.init()` ran, else the one
    the launcher gave."""
    runtime = sys.modules.get("elastic.worker.runtime")  # not imported: not initialised
    if runtime is not None and runtime.is_initialized():
        return runtime.rank(), runtime.size()
    return int(os.environ.get(env.RANK, "0")), int(os.environ.get(env.SIZE, "1"))


def _write(directory: str, name: str, data: bytes) -> None:
    """Write `directory/name` so that a reader sees either nothing or all of it."""
    aside = os.path.join(directory, f".{name}.{os.getpid()}")
    with open(aside, "wb") as file:
        file.write(data)
    os.replace(aside, os.path.join(directory, name))


def dumps(value: Any) -> bytes:
    """`value` pickled with cloudpickle when it is installed (functions by value), else pickle."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(value)
    return cloudpickle.dumps(value)


def main(argv: list[str]) -> int:
    """Run the function in `argv[0]`'s folder; return the worker's exit code."""
    directory = argv[0]
    path = os.path.join(directory, FUNCTION_FILE)
    if not os.path.isfile(path):
        print(
            f"elastic.run_job: no {path} on host {socket.gethostname()}: on remote hosts, give "
            "run_job a shared_dir that every host mounts at the same path",
            file=sys.stderr,
        )
        return 1
    try:
        with open(path, "rb") as file:
            func, args, kwargs = pickle.load(file)
        value = func(*args, **kwargs)
        rank, size = _place()
        data = dumps((size, value))
    except Exception:
        text = traceback.format_exc()
        print(text, file=sys.stderr, end="")
        _write(directory, f"error.{_place()[0]}", text.encode())
        return 1
    _write(directory, f"result.{rank}", data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
