"""Durable commits: committed state written to a directory, so that a job that lost every
worker (a whole fleet reclaimed, a requeue) resumes from it instead of starting over.

The directory is a local path or an fsspec URL (`s3://`, `gs://`, `memory://`). Commit n is
two files: `commit-<n, 12 digits>.pt`, the payload (`torch.save`, written under a temporary
name and then renamed), and `commit-<n>.json`, its manifest (the commit, the payload's size
and SHA-256), written the same way once the payload is complete. A commit without a
manifest, or whose payload does not match it, was never finished: it is never loaded, the
one before it is.

The SHA-256 detects damage, not who wrote a file. What makes a planted file harmless:

* payloads are loaded with `torch.load(..., weights_only=True)`, which builds tensors and
  plain values only, never an arbitrary object (see `elastic.state.loadable`); a payload it
  refuses is passed over like a damaged one. `trust_pickles=True`
  (`--checkpoint-trust-pickles`) loads full pickles instead: for directories whose every
  writer is trusted;
* a manifest must name its own payload, `commit-<n>.pt`, nothing else (no other name, no
  path);
* a local directory is this user's own (`elastic.state.private_dir`): made 0700, files 0600,
  an existing one owned by another user or writable by others refused, links and special
  files in it refused. For an fsspec URL the storage's access control is what decides who
  can write it.

Nothing a checkpoint holds, however made, raises out of `newest()`: a checkpoint that
cannot be used is said in one line and the one before it is tried.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from elastic.errors import ElasticError
from elastic.protocol.env import CheckpointSettings
from elastic.state.loadable import TRUST_FLAG
from elastic.state.private_dir import (
    UntrustedFile,
    check_directory,
    create_file,
    make_directory,
    read_file,
)

log = logging.getLogger("elastic")

FORMAT = 1  # the manifest's "format": what this module writes and reads
_NAME = re.compile(r"^commit-(\d{12})\.json$")
_MANIFEST_LIMIT = 64 * 1024  # bytes: a manifest is about 200
_ZIP_MAGIC = b"PK\x03\x04"  # how every payload `torch.save` writes begins
EXIT_WAIT = 300.0  # seconds a process that exits waits for a durable write in flight


class CheckpointCorrupt(ElasticError, ValueError):
    """A checkpoint that cannot be used: no manifest, a payload that does not match it."""


class CheckpointRefused(CheckpointCorrupt):
    """A checkpoint refused for where it lies or what it holds rather than for damage: a
    manifest naming another file, a link, a file another user may have written, a payload
    that `torch.load(weights_only=True)` refuses."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its commit count and the payload it holds."""

    commit: int
    payload: Any


class _Hashing:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self._file.write(data)
        return len(data)

    def flush(self) -> None:
        self._file.flush()


class CheckpointDir:
    """The checkpoints of one job in one directory (see the module's docstring).

    `trust_pickles`: load payloads as full pickles (`weights_only=False`), which run code of
    whoever wrote them; only for a directory whose every writer is trusted.
    """

    def __init__(self, url: str, trust_pickles: bool = False) -> None:
        if not url:
            raise ValueError("a checkpoint directory must be named")
        self.url = url
        self.trust_pickles = trust_pickles
        self._fs, self._root = fsspec.core.url_to_fs(url)
        self._local = isinstance(self._fs, LocalFileSystem)

    def _path(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    def _create(self, path: str) -> Any:
        return create_file(path) if self._local else self._fs.open(path, "wb")

    def _rename(self, source: str, target: str) -> None:
        if self._local:
            os.replace(source, target)
        else:
            self._fs.mv(source, target)

    def _read(self, path: str, limit: int | None) -> bytes:
        if self._local:
            return read_file(path, limit)
        with self._fs.open(path, "rb") as file:
            data = file.read() if limit is None else file.read(limit + 1)
        if limit is not None and len(data) > limit:
            raise ValueError(f"{path.rsplit('/', 1)[-1]} holds over {limit} bytes")
        return data

    def write(self, commit: int, payload: Any) -> int:
        """Write `payload` as commit `commit`; return its size in bytes. Raises `OSError` (or
        the filesystem's own error) when it cannot, `UntrustedDirectory` for a local
        directory another user owns or may write; a failed write leaves no manifest."""
        if self._local:
            make_directory(self._root)
        else:
            self._fs.makedirs(self._root, exist_ok=True)
        name = f"commit-{commit:012d}"
        token = uuid.uuid4().hex[:8]
        payload_tmp = self._path(f".{name}.pt.{token}.tmp")
        with self._create(payload_tmp) as file:
            hashing = _Hashing(file)
            torch.save(payload, hashing)
            self._sync(file)
        self._rename(payload_tmp, self._path(f"{name}.pt"))
        manifest = {
            "format": FORMAT,
            "commit": commit,
            "payload": f"{name}.pt",
            "bytes": hashing.size,
            "sha256": hashing.sha256.hexdigest(),
            "written_at": time.time(),
        }
        manifest_tmp = self._path(f".{name}.json.{token}.tmp")
        with self._create(manifest_tmp) as file:
            file.write(json.dumps(manifest).encode())
            self._sync(file)
        self._rename(manifest_tmp, self._path(f"{name}.json"))
        if self._local:  # the renames themselves survive a power loss
            fd = os.open(self._root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return hashing.size

    def _sync(self, file: Any) -> None:
        file.flush()
        if self._local:
            os.fsync(file.fileno())

    def commits(self) -> list[int]:
        """The commits that have a manifest, newest first (none when the directory is
        missing). Raises `UntrustedDirectory` for a local directory another user owns or may
        write, the filesystem's error when it cannot be listed."""
        try:
            if self._local:
                check_directory(self._root)
            names = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        found = [_NAME.match(str(name).rsplit("/", 1)[-1]) for name in names]
        return sorted((int(m[1]) for m in found if m), reverse=True)

    def load(self, commit: int) -> Checkpoint:
        """Verify commit `commit` against its manifest and load it. Raises `CheckpointRefused`
        or `CheckpointCorrupt` (the message says which file and why) when it cannot be used,
        `UntrustedDirectory` for a local directory another user owns or may write."""
        name = f"commit-{commit:012d}"
        if self._local:
            check_directory(self._root)
        try:
            manifest = json.loads(self._read(self._path(f"{name}.json"), _MANIFEST_LIMIT))
            if not isinstance(manifest, dict) or (
                manifest.get("format"),
                manifest.get("commit"),
            ) != (FORMAT, commit):
                raise CheckpointCorrupt(f"{name}.json is no manifest of commit {commit}")
            if manifest.get("payload") != f"{name}.pt":
                raise CheckpointRefused(
                    f"{name}.json names the payload {str(manifest.get('payload'))[:200]!r}, "
                    f"not {name}.pt: a manifest names only its own payload in its directory"
                )
            size = manifest.get("bytes")
            data = self._read(self._path(f"{name}.pt"), size if isinstance(size, int) else None)
        except CheckpointCorrupt:
            raise
        except UntrustedFile as err:
            raise CheckpointRefused(str(err)) from err
        except Exception as err:  # a missing file, bad JSON: whatever it is, not usable
            raise CheckpointCorrupt(f"{name}: {type(err).__name__}: {err}") from err
        if len(data) != size:
            raise CheckpointCorrupt(f"{name}.pt holds {len(data)} bytes, its manifest says {size}")
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise CheckpointCorrupt(f"{name}.pt does not match its manifest's SHA-256")
        return Checkpoint(commit, self._unpickle(f"{name}.pt", data))

    def _unpickle(self, name: str, data: bytes) -> Any:
        if not data.startswith(_ZIP_MAGIC):  # torch.save's format; torch would try a bare pickle
            raise CheckpointCorrupt(
                f"{name} is not a torch file (torch.save writes a zip archive, this begins "
                f"{data[:8]!r})"
            )
        weights_only = not self.trust_pickles
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
        except pickle.UnpicklingError as err:
            if not weights_only:
                raise CheckpointCorrupt(f"{name} is not a torch file: {_first_line(err)}") from None
            raise CheckpointRefused(
                f"{name} holds what torch.load(weights_only=True) refuses ({_first_line(err)}); "
                f"if you trust every writer of {self.url}, {TRUST_FLAG} loads full pickles"
            ) from None
        except Exception as err:  # not a zip, a torn archive: torch says RuntimeError
            raise CheckpointCorrupt(
                f"{name} is not a torch file ({type(err).__name__}: {_first_line(err)})"
            ) from None

    def newest(self, fits: Callable[[Any], str | None] | None = None) -> Checkpoint | None:
        """The newest checkpoint that verifies, loads and (where `fits` is given) of which
        `fits(payload)` finds nothing wrong; each one passed over is said in one line. None
        when there is none, or when the directory cannot be listed or is refused (said in
        one line too). Raises nothing a checkpoint's content could cause."""
        try:
            commits = self.commits()
        except Exception as err:  # an unreachable store, a directory refused
            log.error("checkpoints in %s: none loaded, %s", self.url, err)
            return None
        for commit in commits:
            try:
                checkpoint = self.load(commit)
            except CheckpointCorrupt as err:
                log.warning("checkpoint %s: not used, %s", self.url, err)
                continue
            except Exception as err:  # the directory changed meanwhile, the store went away
                log.error("checkpoints in %s: none loaded, %s", self.url, err)
                return None
            wrong = fits(checkpoint.payload) if fits is not None else None
            if wrong is None:
                return checkpoint
            log.warning("checkpoint %s: not used, commit-%012d.pt %s", self.url, commit, wrong)
        return None

    def prune(self, keep: int) -> None:
        """Delete all but the newest `keep` commits, and the temporary files of commits older
        than those (a writer that died midway)."""
        commits = self.commits()
        if len(commits) <= keep:
            return
        oldest_kept = commits[keep - 1]
        for name in self._fs.ls(self._root, detail=False):
            base = str(name).rsplit("/", 1)[-1]
            match = re.match(r"^\.?commit-(\d{12})\.", base)
            if match and int(match[1]) < oldest_kept:
                # A writer of an earlier round may have pruned it first.
                with contextlib.suppress(FileNotFoundError):
                    self._fs.rm(self._path(base))


def _first_line(err: BaseException) -> str:
    """The first line of an error's message (torch's weights-only refusal runs to 20 lines),
    with its most telling part first where torch names it."""
    text = str(err)
    marker = "WeightsUnpickler error: "
    if marker in text:
        text = text[text.index(marker) + len(marker) :]
    line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return line.split(" Please use", 1)[0][:300]


class DurableWriter:
    """Writes commits to a `CheckpointDir` from one daemon thread, one write at a time.

    `offer(commit, payload, done)` starts a write when one is due (every `every_commits`
    commits, or `every_seconds` after the last one, whichever comes first) and none is in
    flight, and returns at once; `done()` is called on the writer's thread when the payload
    is no longer needed. A failed write is logged (once per distinct error), training goes
    on, and `stale` says the durable copy lags; the next due commit tries again. The newest
    `keep` commits are kept. A process that exits normally waits up to `exit_wait` seconds for
    the write in flight (saying so), so that a finished job's last write is not cut short.
    """

    def __init__(
        self,
        directory: CheckpointDir,
        every_commits: int = 1,
        every_seconds: float | None = None,
        keep: int = 2,
        clock: Callable[[], float] = time.monotonic,
        exit_wait: float = EXIT_WAIT,
    ) -> None:
        if every_commits < 1 or keep < 1 or (every_seconds is not None and every_seconds <= 0):
            raise ValueError(
                f"durable commits: every_commits ({every_commits}) and keep ({keep}) must be at "
                f"least 1, every_seconds ({every_seconds}) positive"
            )
        self.directory = directory
        self._every_commits = every_commits
        self._every_seconds = every_seconds
        self._keep = keep
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_offered: tuple[int, float] | None = None  # (commit, when)
        self.written = 0  # the newest commit written
        self.started = 0  # writes started
        self.error: str | None = None  # the last write's failure, until one succeeds
        self._in_flight = 0  # the commit being written
        self._exit_wait = exit_wait
        atexit.register(self._finish_at_exit)

    @property
    def busy(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def stale(self) -> bool:
        """Whether the last write failed: the durable copy is older than it should be."""
        return self.error is not None

    def due(self, commit: int) -> bool:
        """Whether `offer(commit, ...)` would start a write: none in flight, `commit` newer
        than the last written, and enough commits or seconds since the last offered."""
        if self.busy or commit <= self.written:
            return False
        if self._last_offered is None:
            return True
        last_commit, when = self._last_offered
        if commit - last_commit >= self._every_commits:
            return True
        seconds = self._every_seconds
        return seconds is not None and self._clock() - when >= seconds

    def offer(self, commit: int, payload: Any, done: Callable[[], None] | None = None) -> bool:
        """Write `payload` as commit `commit` in the background if a write is due and none is
        in flight; True if it started one."""
        with self._lock:
            if not self.due(commit):
                return False
            self._last_offered = (commit, self._clock())
            self._in_flight = commit
            self.started += 1
            self._thread = threading.Thread(
                target=self._write,
                args=(commit, payload, done),
                name="elastic-durable-commit",
                daemon=True,
            )
            self._thread.start()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight, if any; True if none is left."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.busy

    def _finish_at_exit(self) -> None:
        """At interpreter exit: let the write in flight end, within `exit_wait` seconds."""
        if not self.busy:
            return
        commit = self._in_flight
        log.info("waiting up to %g s for durable commit %d to be written", self._exit_wait, commit)
        if not self.wait(self._exit_wait):
            log.error(
                "durable commit %d was not written within %g s: exiting without it (newest "
                "written: %s)",
                commit,
                self._exit_wait,
                self.written or "none",
            )

    def _write(self, commit: int, payload: Any, done: Callable[[], None] | None) -> None:
        # The lowest CPU priority for this thread (Linux nices threads one by one): where
        # training keeps every core busy, the write waits for idle time, not the step.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        started = time.monotonic()
        try:
            size = self.directory.write(commit, payload)
        except Exception as err:  # a full disk, a permission, a network store's error
            message = f"{type(err).__name__}: {err}"
            if message != self.error:
                log.error(
                    "durable commit %d to %s failed (%s); training goes on, the durable copy "
                    "is stale (newest written: %s)",
                    commit,
                    self.directory.url,
                    message,
                    self.written or "none",
                )
            self.error = message
        else:
            self.written, self.error = commit, None
            self._prune()
            log.debug(
                "durable commit %d: %d bytes in %.2f s", commit, size, time.monotonic() - started
            )
        finally:
            if done is not None:
                done()

    def _prune(self) -> None:
        try:
            self.directory.prune(self._keep)
        except Exception as err:  # old commits stay: more disk used, nothing lost
            log.warning("old durable commits in %s not deleted: %s", self.directory.url, err)


def durable_writer(checkpoint_dir: str | None = None) -> DurableWriter | None:
    """The writer of a state's durable commits: to `checkpoint_dir` when given, else to the
    launcher's `--checkpoint-dir` (`ELASTIC_CHECKPOINT_DIR`); the cadence, the number kept
    and whether full pickles are trusted (`ELASTIC_CHECKPOINT_TRUST_PICKLES`) come from the
    environment either way. None when no directory is named."""
    settings = CheckpointSettings.from_env()
    directory = checkpoint_dir or settings.directory
    if not directory:
        return None
    return DurableWriter(
        CheckpointDir(directory, trust_pickles=settings.trust_pickles),
        every_commits=settings.every,
        every_seconds=settings.interval or None,
        keep=settings.keep,
    )
