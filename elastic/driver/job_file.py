"""The job file: where a running driver says how to reach it, for `elasticrun status`,
`drain`, `undrain` and `stop` run by the same user on the same host.

`<runtime dir>/<job id>.json`, mode 0600 in a folder of mode 0700, where the runtime dir is
`$XDG_RUNTIME_DIR/elasticrun`, or `/tmp/elasticrun-<uid>` without it. It holds the job's
token (so only its user may read it), the driver's pid and host and its URLs. The driver
writes it once it serves and removes it when the job ends. The file of an etcd job whose
driver was killed is kept: it holds the token that the job's next driver on this host reads
(etcd holds none; see `elastic.driver.journal.job_token`).

Beside it, `<job id>.lock` is the job id's claim on this host (`claim_job_id`): a driver of the
memory backend holds an exclusive `flock` on it from its start to its end, so a second driver
started with a running job's id is refused before it writes anything. The kernel drops the lock
when its driver dies, however it dies, so a dead driver never keeps its id.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from elastic.driver.errors import LaunchError
from elastic.driver.launch.private_files import open_private, private_dir
from elastic.protocol.http import DriverUrls

SUFFIX = ".json"
LOCK_SUFFIX = ".lock"


class SeveralJobs(LaunchError):
    """Several jobs run and none was named."""


class JobFile(BaseModel):
    job_id: str
    pid: int
    host: str
    started: float  # Unix seconds
    token: str = Field(repr=False)  # never in a traceback or a log line
    urls: DriverUrls
    tls_cert: str | None = None  # the driver's certificate (public PEM), with --tls
    durable: bool = False  # etcd backend: the file outlives its driver, for the next one


class JobIdTaken(LaunchError):
    """A live driver on this host holds the job id; the message is what its lock file says of
    that driver (`holder` given to `claim_job_id`), or empty when it had not said yet."""


class JobIdClaim:
    """This driver's hold on a job id on this host: an open, `flock`ed lock file. `release`
    removes the file and drops the lock; the process's death drops the lock too."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the id up. Idempotent; never raises."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # while locked: a waiter that opened it sees it is gone
        os.close(self._fd)
        self._fd = None


def claim_job_id(job_id: str, holder: str, folder: Path | None = None) -> JobIdClaim:
    """Hold job id `job_id` on this host for this process, writing `holder` (who holds it)
    into the lock file. Raises `JobIdTaken` when a live process holds it, `LaunchError` when
    the runtime folder or the lock file cannot be used (a link, another user's)."""
    folder = folder or runtime_dir()
    private_dir(str(folder))
    path = folder / f"{job_id}{LOCK_SUFFIX}"
    while True:
        fd = open_private(str(path), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            said = ""
            with contextlib.suppress(OSError):
                said = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            raise JobIdTaken(said) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except OSError:
            same = False  # its holder removed it as we locked it: lock the new one
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode(), 0)
    return JobIdClaim(path, fd)


def urls_of(api: str) -> DriverUrls:
    """The driver's URLs, from its HTTP API's base URL."""
    return DriverUrls(api=api, metrics=f"{api}/metrics", page=f"{api}/ui")


def runtime_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where job files live for this user."""
    base = environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "elasticrun"
    return Path(f"/tmp/elasticrun-{os.geteuid()}")


def write_job_file(
    job_id: str,
    token: str,
    api: str,
    tls_cert: str | None = None,
    folder: Path | None = None,
    *,
    durable: bool = False,
) -> Path:
    """Write this driver's job file; return its path. Raises `LaunchError` (one line) when
    the folder is a link, another user's, or cannot be made. `durable` (etcd backend): the
    file is kept after its driver dies, as it holds the token a restarted driver needs
    (`elastic.driver.journal.job_token`); the next driver's file replaces it."""
    folder = folder or runtime_dir()
    private_dir(str(folder))
    path = folder / f"{job_id}{SUFFIX}"
    record = JobFile(
        job_id=job_id, pid=os.getpid(), host=socket.gethostname(), started=time.time(),
        token=token, urls=urls_of(api), tls_cert=tls_cert, durable=durable,
    )  # fmt: skip
    temporary = folder / f".{job_id}.{os.getpid()}.tmp"
    fd = open_private(str(temporary), os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(record.model_dump_json())
    os.replace(temporary, path)  # a reader sees the whole file or none
    return path


def remove_job_file(path: Path) -> None:
    """Remove the job file at `path` if it is still this process's."""
    with contextlib.suppress(OSError, ValidationError):
        if JobFile.model_validate_json(path.read_bytes()).pid == os.getpid():
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_job_files(folder: Path | None = None) -> tuple[list[JobFile], list[str]]:
    """The job files of running drivers on this host, oldest first, and one line for each
    file that is unreadable or whose driver is gone (such a file is removed, but for an etcd
    job's: it keeps the token for the job's next driver)."""
    folder = folder or runtime_dir()
    running, problems = [], []
    try:
        paths = sorted(folder.glob(f"*{SUFFIX}"))
    except OSError:
        return [], []
    for path in paths:
        try:
            record = JobFile.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as err:
            problems.append(f"{path}: not a job file ({type(err).__name__})")
            continue
        if record.host == socket.gethostname() and not _alive(record.pid):
            if record.durable:
                problems.append(
                    f"job {record.job_id}'s driver (pid {record.pid}) is gone; run the same "
                    f"elasticrun command with --job-id {record.job_id} to take the job up "
                    f"(it reads the token from {path})"
                )
                continue
            with contextlib.suppress(OSError):
                path.unlink()  # nothing reaches that driver any more
            problems.append(
                f"job {record.job_id}'s driver (pid {record.pid}) is gone; removed {path}"
            )
            continue
        running.append(record)
    running.sort(key=lambda r: r.started)
    return running, problems


def find_job(job_id: str | None, folder: Path | None = None) -> JobFile:
    """The running job `job_id`, or the only running one. Raises `LaunchError` with one line
    when there is none, `SeveralJobs` when several run and no `job_id` names one."""
    running, problems = read_job_files(folder)
    where = folder or runtime_dir()
    if job_id is not None:
        for record in running:
            if record.job_id == job_id:
                return record
        gone = [p for p in problems if f"job {job_id}'s" in p]
        raise LaunchError(gone[0] if gone else f"no running job {job_id} in {where}")
    if not running:
        raise LaunchError(f"no running job in {where} (started by this user on this host)")
    if len(running) > 1:
        ids = ", ".join(r.job_id for r in running)
        raise SeveralJobs(f"{len(running)} jobs run ({ids}): name one with --job-id")
    return running[0]
