"""The processes of this machine, read from /proc: which are still alive, which name a file."""

from __future__ import annotations

import os
from pathlib import Path


def _state(pid: int | str) -> str | None:
    """The state letter of process `pid` ("Z" for a zombie); None if there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def pids_alive(pids: list[int]) -> list[int]:
    """Those of `pids` that are processes still running (not zombies)."""
    return [pid for pid in pids if _state(pid) not in (None, "Z")]


def processes_naming(marker: str) -> dict[int, list[str]]:
    """Live (non-zombie) processes, other than this one, whose command line contains
    `marker`, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(marker in arg for arg in argv) and _state(entry.name) not in (None, "Z"):
            found[int(entry.name)] = argv
    return found


def processes_working_in(folder: str) -> list[int]:
    """Live (non-zombie) processes, other than this one, whose working directory is `folder`
    or under it: a job's workers run where the test started `elasticrun`, whatever their
    command line names."""
    root = os.path.realpath(folder)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        inside = cwd == root or cwd.startswith(root + os.sep)
        if inside and _state(entry.name) not in (None, "Z"):
            found.append(int(entry.name))
    return found


def standby_processes(environment_holds: str) -> set[int]:
    """Live standby processes (`python -m elastic.worker.standby`; not their keepers, whose
    command lines name it too) whose environment holds `environment_holds` (a job's
    `ELASTIC_JOB_ID=...`, a folder its command names)."""
    found = set()
    for pid, argv in processes_naming("elastic.worker.standby").items():
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if module == "elastic.worker.standby" and environment_holds in environ:
            found.add(pid)
    return found
