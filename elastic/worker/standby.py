"""A warm standby: a process that has imported torch, the worker runtime and the modules the
user named (`--preload`), and waits until the driver gives it a worker's slot. It then runs
the job's command from the top in this process, as `python` would have, so a refilled slot
pays only for the script's own work.

Run by the driver as `<python> <options> -m elastic.worker.standby`, with the job's worker
environment plus `ELASTIC_STANDBY_ID`, `ELASTIC_STANDBY_COMMAND` (the job's command, JSON)
and `ELASTIC_STANDBY_PRELOAD`.

Guarantees:
* the imports run in a thread at the lowest CPU priority (SCHED_IDLE and nice 19, and the
  process's autogroup at nice 19 where the kernel has one, set back to 0 once they are
  done): a standby that starts beside training slows it as little as the scheduler allows;
  waiting costs no CPU;
* no CUDA context is made before the standby is used (a preloaded module that makes one is
  reported at once);
* once taken, the process has exactly the worker's environment and `sys.argv`, runs the
  target as `__main__`, and exits as Python would (the script's exit code, a traceback and
  1 for an uncaught exception). Where the process could not look the same as a fresh one
  (an interpreter variable such as `PYTHONPATH` differs), it `exec`s the command instead:
  the same pid, a cold start;
* it exits 0 when the driver does not want it (the job ended, a restarted driver never
  started it) and 1 when the driver stays unreachable past the worker's retry budget.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
import threading
import types

from elastic.protocol.env import STANDBY_COMMAND, STANDBY_ID, STANDBY_PRELOAD
from elastic.protocol.http import StandbyAnswer, StandbyWaitRequest
from elastic.protocol.python_command import PythonCommand, read_python_command

POLL_SECONDS = 30.0  # how long one wait at the driver lasts
LOWEST_PRIORITY = 19
_AUTOGROUP = "/proc/self/autogroup"


def main() -> int:
    """The standby's life: warm up, wait for a slot, run the job's command in it.

    Returns:
        The exit code when it leaves without running the command (0: not wanted; 1: the
        driver is gone, or its environment is not a standby's); running the command does
        not return here unless the command returns.
    """
    standby_id = os.environ.get(STANDBY_ID, "")
    command = _command()
    if not standby_id or command is None:
        print(
            "elastic.worker.standby: not started by elasticrun as a standby "
            f"({STANDBY_ID} or {STANDBY_COMMAND} missing or unusable)",
            file=sys.stderr,
        )
        return 1
    python = read_python_command(command)
    if python is None:
        print(f"elastic.worker.standby: {command!r} is not a Python command", file=sys.stderr)
        return 1
    preload = [name for name in os.environ.get(STANDBY_PRELOAD, "").split(",") if name]
    _warm_up(_startup_path(python), preload)
    env = _wait_for_slot(standby_id)
    if env is None:
        return 0
    _become(python, command, env)
    return 0


def _command() -> list[str] | None:
    """The job's command as the driver gave it, or None when it is not a list of strings."""
    try:
        command = json.loads(os.environ.get(STANDBY_COMMAND, ""))
    except ValueError:
        return None
    if not isinstance(command, list) or not all(isinstance(word, str) for word in command):
        return None
    return command


def _startup_path(python: PythonCommand) -> str | None:
    """What Python would put first on `sys.path` for the target: the script's folder (the
    current folder for `-m`/`-c`, which `-m` gave this process already); None with `-P`/`-I`."""
    if sys.flags.safe_path or python.kind != "script":
        return None
    return os.path.dirname(os.path.abspath(python.target))


def _warm_up(first_path: str | None, preload: list[str]) -> None:
    """Import torch, the worker runtime, the first optimizer's lazy imports and `preload` at
    the lowest priority, in a thread. A module whose import fails there is imported again in
    the main thread (some must be: they set signal handlers); one that fails there too is
    reported and ends the standby (exit 1): every worker of the job would fail the same way."""
    if first_path is not None:
        sys.path[0] = first_path
    names = ["torch", "elastic.torch", *preload]
    failed: list[str] = []

    def imports() -> None:
        _lower_own_priority()
        for name in names:
            if failed:  # the rest after it, in the main thread
                failed.append(name)
                continue
            try:
                importlib.import_module(name)
                if name == "elastic.torch":
                    _build_an_optimizer()
            except Exception:  # noqa: BLE001 (tried again in the main thread)
                failed.append(name)

    _set_autogroup_nice(LOWEST_PRIORITY)
    thread = threading.Thread(target=imports, name="standby-imports", daemon=True)
    thread.start()
    thread.join()
    _set_autogroup_nice(0)
    for name in failed:
        try:
            importlib.import_module(name)
            if name == "elastic.torch":
                _build_an_optimizer()
        except Exception as error:  # noqa: BLE001 (the standby's one line, then exit 1)
            print(
                f"elastic.worker.standby: preloading failed: {type(error).__name__}: {error}",
                file=sys.stderr,
            )
            raise SystemExit(1) from None
    import torch

    if torch.cuda.is_initialized():
        print(
            "elastic.worker.standby: a preloaded module made a CUDA context before the "
            "standby was used: it holds GPU memory while it waits",
            file=sys.stderr,
        )


def _build_an_optimizer() -> None:
    """What the first optimizer of a process imports lazily (`torch._dynamo`, 1.5 s here)."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _lower_own_priority() -> None:
    """The calling thread only (Linux: a thread's priority is its own) at nice 19 and under
    SCHED_IDLE: it runs when nothing else wants the CPU, and a training thread that wakes
    takes the CPU from it at once rather than at the next tick."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _set_autogroup_nice(nice: int) -> None:
    """Where the kernel groups a session's threads (autogroup), a thread's nice only weighs
    inside its group: set the group's (any user may raise it, and set it back to 0)."""
    with contextlib.suppress(OSError), open(_AUTOGROUP, "w") as group:
        group.write(str(nice))


def _wait_for_slot(standby_id: str) -> dict[str, str] | None:
    """Wait at the driver until it hands over a slot.

    Returns:
        The worker's whole environment, or None when the driver does not want this standby.

    Raises:
        SystemExit(1): the driver stayed unreachable past the retry budget (it is gone).
    """
    from elastic.errors import ElasticError
    from elastic.worker.config import WorkerConfig
    from elastic.worker.driver_link.http_client import DriverClient, DriverError

    try:
        config = WorkerConfig.from_env()
    except ElasticError as error:  # not started by elasticrun, or a variable it cannot use
        print(f"elastic.worker.standby: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    client = DriverClient.for_worker(config)
    request = StandbyWaitRequest(standby_id=standby_id, timeout=POLL_SECONDS)
    try:
        while True:
            try:
                answer = client.post("/v1/standby/wait", request, StandbyAnswer, wait=POLL_SECONDS)
            except DriverError as error:
                print(f"elastic.worker.standby: leaving: {error}", file=sys.stderr)
                raise SystemExit(1) from None
            if answer.status == "exit":
                return None
            if answer.status == "run" and answer.env is not None:
                return answer.env
    finally:
        client.close()


def _become(python: PythonCommand, command: list[str], env: dict[str, str]) -> None:
    """Take the worker's environment and run `command` here; `exec` it where this process
    could not look the same as a fresh one (see the module)."""
    startup = {k for k in set(env) | set(os.environ) if k.startswith("PYTHON")}
    if any(env.get(k) != os.environ.get(k) for k in startup):
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(command[0], command, env)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = python.argv()
    try:
        _run(python)
    except Exception as error:  # SystemExit and KeyboardInterrupt go on as in python
        frames = _script_frames(error.__traceback__)
        # As python's own report does: kept where exit hooks look (the runtime tells the
        # driver that the script failed, not that it finished).
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, frames
        sys.last_exc = error  # type: ignore[attr-defined]  (Python 3.12's name)
        sys.excepthook(type(error), error.with_traceback(frames), frames)
        raise SystemExit(1) from None


def _run(python: PythonCommand) -> None:
    """Run the target as `__main__`, as `python` would."""
    if python.kind == "script":
        runpy.run_path(python.target, run_name="__main__")
    elif python.kind == "module":
        runpy.run_module(python.target, run_name="__main__", alter_sys=True)
    else:
        main_module = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(python.target, "<string>", "exec"), main_module.__dict__)


def _script_frames(frames: types.TracebackType | None) -> types.TracebackType | None:
    """A traceback without its first frames in this module and runpy: what `python` shows."""
    while frames is not None and (
        frames.tb_frame.f_code.co_filename == __file__
        or "runpy" in frames.tb_frame.f_code.co_filename
    ):
        frames = frames.tb_next
    return frames


if __name__ == "__main__":
    sys.exit(main())
