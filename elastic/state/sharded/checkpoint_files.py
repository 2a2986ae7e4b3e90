"""Durable checkpoints of sharded state on disk: their layout, their marker, and what is
trusted when one is read.

A checkpoint directory (a local path or an fsspec URL, `--checkpoint-dir`) holds, for each
checkpoint of a `ShardedState`:

* `sharded-<commit, 12 digits>-r<round>/`: a `torch.distributed.checkpoint` (DCP) checkpoint
  that DCP reads at any world size: `.metadata` (DCP's index, written by rank 0) and
  `__<rank>_0.distcp` (each rank's shards: model, optimizer state, and its plain values and
  samplers as one byte tensor under `plain.<rank>`);
* `sharded-<commit>-r<round>.json`: the marker, written by rank 0 only after every rank's
  write finished (DCP's save ends with an all-reduce over the ranks' write results), under a
  temporary name and renamed. It names the checkpoint's own directory, its files and their
  sizes, and the SHA-256 of `.metadata`. A checkpoint without a marker, or whose files do not
  match it, was never finished: it is never loaded.

What is unpickled, and from where (the trust rules of `elastic.state.durable` applied to DCP):

* a local directory must be this user's own (`elastic.state.private_dir`): the checkpoint
  directory and each checkpoint's directory 0700 or at least not writable by others, every
  file in them a regular file (no link) owned by this user and not writable by others; for
  an fsspec URL the storage's access control decides who can write it;
* the marker is JSON; it may name only its own directory, and in it only DCP's file names;
* `.metadata` (a pickle, which DCP reads with a full `pickle.load`) must match the marker's
  SHA-256 and is read with an unpickler that builds only DCP's metadata classes, `torch.Size`,
  dtypes, layouts, memory formats and paths (`_MetadataUnpickler`); each of its entries must
  name a file the marker lists;
* tensors are read by DCP with `torch.load(weights_only=True)`; DCP's non-tensor items
  (optimizer hyper-parameters) and each rank's plain values with `weights_only=True` too
  (DCP's own planner uses full pickles there: `WeightsOnlyLoadPlanner`).

Nothing is fully unpickled unless the directory trusts full pickles
(`--checkpoint-trust-pickles`), which restores DCP's own readers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from elastic.errors import ElasticError
from elastic.state.private_dir import check_directory, create_file, make_directory, read_file

FORMAT = 1  # the marker's "format"
_MARKER = re.compile(r"^sharded-(\d{12})-r(\d+)\.json$")
_DIR = re.compile(r"^sharded-(\d{12})-r(\d+)$")
_DCP_FILE = re.compile(r"^(\.metadata|__\d+_\d+\.distcp)$")
_MARKER_LIMIT = 1024 * 1024  # bytes: a marker is a few hundred, plus a line per rank
_METADATA_LIMIT = 1 << 30  # bytes of DCP's index we are willing to read
_WRITE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class CheckpointUnusable(ElasticError, ValueError):
    """A sharded checkpoint that cannot be used: unfinished, damaged, or refused for where it
    lies or what it holds; the message says which file and why."""


@dataclass(frozen=True)
class Marker:
    """A finished checkpoint, as its marker describes it."""

    commit: int  # the commit count it was taken at
    round: int  # the round that wrote it
    world: int  # the number of ranks that wrote it
    step: int | None  # the optimizer's step count at that commit, where it keeps one
    files: dict[str, int]  # DCP's files in its directory, with their sizes
    metadata_sha256: str
    plain_bytes: list[int]  # the size of each old rank's plain values

    @property
    def name(self) -> str:
        return f"sharded-{self.commit:012d}-r{self.round}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": "sharded",
            "commit": self.commit,
            "round": self.round,
            "world": self.world,
            "step": self.step,
            "dir": self.name,
            "files": self.files,
            "metadata_sha256": self.metadata_sha256,
            "plain_bytes": self.plain_bytes,
            "written_at": time.time(),
        }

    @classmethod
    def from_json(cls, name: str, data: bytes) -> Marker:
        """The marker file `name` holds `data`; `CheckpointUnusable` for anything but a
        marker of the checkpoint `name` says, naming only DCP's files in its own
        directory."""
        match = _MARKER.match(name)
        if match is None:
            raise CheckpointUnusable(f"{name} is not a marker's name")
        try:
            raw = json.loads(data)
            commit, round_ = int(match[1]), int(match[2])
            if (raw["format"], raw["kind"], raw["commit"], raw["round"]) != (
                FORMAT, "sharded", commit, round_,
            ):  # fmt: skip
                raise ValueError("it describes another checkpoint")
            files = {str(k): int(v) for k, v in raw["files"].items()}
            marker = cls(
                commit=commit,
                round=round_,
                world=int(raw["world"]),
                step=None if raw["step"] is None else int(raw["step"]),
                files=files,
                metadata_sha256=str(raw["metadata_sha256"]),
                plain_bytes=[int(n) for n in raw["plain_bytes"]],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointUnusable(f"{name} is no sharded checkpoint's marker: {err}") from None
        if raw.get("dir") != marker.name:
            raise CheckpointUnusable(
                f"{name} names the directory {str(raw.get('dir'))[:200]!r}, not {marker.name}: "
                "a marker names only its own checkpoint"
            )
        strange = [f for f in files if not _DCP_FILE.match(f)]
        if strange or ".metadata" not in files or len(marker.plain_bytes) != marker.world:
            raise CheckpointUnusable(
                f"{name} lists {strange[:3] or 'no .metadata'}: a marker lists only DCP's "
                "files (.metadata, __<rank>_<n>.distcp) in its own directory"
            )
        return marker


def newest_first(names: Iterable[str]) -> list[tuple[int, int, str]]:
    """The markers among `names` (base names of a directory's entries) as `(commit, round,
    name)`, newest first: by commit, then by round (a later round re-took that commit)."""
    found = [(int(m[1]), int(m[2]), name) for name in names if (m := _MARKER.match(name))]
    return sorted(found, reverse=True)


def choose_newest(
    names: Iterable[str], verify: Callable[[str], Marker]
) -> tuple[Marker | None, list[str]]:
    """The newest checkpoint among the directory entries `names` that has a marker and that
    `verify(marker name)` accepts (it raises `CheckpointUnusable` otherwise), and one line
    per newer checkpoint passed over. A checkpoint directory without a marker (one being
    written, or whose writers died) is never a candidate."""
    passed: list[str] = []
    for _, _, name in newest_first(names):
        try:
            return verify(name), passed
        except CheckpointUnusable as err:
            passed.append(str(err))
    return None, passed


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = frozenset(
    {
        (_METADATA_MODULE, name)
        for name in (
            "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
            "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata and nothing else: a class or function outside `_ALLOWED` (and
    torch's dtypes and memory formats) is refused, so a planted `.metadata` cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.memory_format):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP's index never holds")


def read_metadata(data: bytes, marker: Marker) -> Any:
    """DCP's `Metadata` from `.metadata`'s bytes, checked against `marker`: its SHA-256, and
    every storage entry naming a file the marker lists. Raises `CheckpointUnusable`."""
    if hashlib.sha256(data).hexdigest() != marker.metadata_sha256:
        raise CheckpointUnusable(f"{marker.name}/.metadata does not match its marker's SHA-256")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        storage = metadata.storage_data
        paths = {info.relative_path for info in storage.values()}
    except Exception as err:  # refused, torn, or not DCP's index at all
        raise CheckpointUnusable(f"{marker.name}/.metadata is refused: {err}") from None
    if strange := sorted(p for p in paths if not isinstance(p, str) or p not in marker.files):
        raise CheckpointUnusable(
            f"{marker.name}/.metadata names {strange[:3]}, which its marker does not list"
        )
    return metadata


def _checked_reader(base: type, marker: Marker) -> type:
    """A DCP reader class (`base`: `FileSystemReader` or `FsspecReader`) whose `.metadata`
    is read by `read_metadata`."""

    class CheckedReader(base):  # type: ignore[misc, valid-type]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as file:
                data = file.read(_METADATA_LIMIT + 1)
            metadata = read_metadata(data, marker)
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return CheckedReader


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor items with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class ShardedCheckpointDir:
    """The sharded checkpoints of one job in one directory (see the module's docstring).

    `trust_pickles`: read with DCP's own readers, which unpickle `.metadata` and non-tensor
    items in full (code of whoever wrote them); only for a directory whose every writer is
    trusted.
    """

    def __init__(self, url: str, trust_pickles: bool = False) -> None:
        if not url:
            raise ValueError("a checkpoint directory must be named")
        self.url = url
        self.trust_pickles = trust_pickles
        self._fs, self._root = fsspec.core.url_to_fs(url)
        self.local = isinstance(self._fs, LocalFileSystem)

    def path(self, name: str) -> str:
        """Where `name` lies in the directory (a local path, or the URL's form)."""
        if self.local:
            return os.path.join(self._root, name)
        protocol = self.url.split("://", 1)[0] if "://" in self.url else None
        root = f"{self._root.rstrip('/')}/{name}"
        return f"{protocol}://{root}" if protocol else root

    def _local(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    # --- writing ----------------------------------------------------------------------------

    def prepare(self, marker_name: str) -> str:
        """Make the checkpoint directory (0700 where local) and the directory of the
        checkpoint `marker_name` names; return the latter's path. Every rank calls it."""
        if self.local:
            make_directory(self._root)
            path = self._local(marker_name)
            os.makedirs(path, mode=0o700, exist_ok=True)
            check_directory(path)
            return path
        self._fs.makedirs(self._local(marker_name), exist_ok=True)
        return self.path(marker_name)

    def writer(self, marker_name: str) -> Any:
        """DCP's storage writer for the checkpoint `marker_name` names. It makes the
        directories (`prepare`) in DCP's planning step, whose errors DCP gathers: a rank
        that cannot write fails the save on every rank, never leaves the others waiting."""
        base = FileSystemWriter if self.local else FsspecWriter
        prepare = self.prepare

        class PreparedWriter(base):  # type: ignore[misc, valid-type]
            def prepare_local_plan(self, plan: Any) -> Any:
                prepare(marker_name)
                return super().prepare_local_plan(plan)

        return PreparedWriter(self.path(marker_name), overwrite=False)

    def finish(self, marker: Marker) -> None:
        """Write `marker` once every rank's files are written (rank 0, after DCP's save
        returned): fill in the files' sizes and `.metadata`'s SHA-256, then write the marker
        under a temporary name and rename it."""
        directory = self._local(marker.name)
        files = {}
        for entry in self._fs.ls(directory, detail=True):
            base = str(entry["name"]).rsplit("/", 1)[-1]
            if _DCP_FILE.match(base):
                files[base] = int(entry["size"])
        metadata = self._read(f"{directory}/.metadata", _METADATA_LIMIT)
        done = Marker(
            marker.commit, marker.round, marker.world, marker.step, files,
            hashlib.sha256(metadata).hexdigest(), marker.plain_bytes,
        )  # fmt: skip
        name = f"{marker.name}.json"
        tmp = self._local(f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        with create_file(tmp) if self.local else self._fs.open(tmp, "wb") as file:
            file.write(json.dumps(done.to_json()).encode())
            file.flush()
            if self.local:
                os.fsync(file.fileno())
        if self.local:
            os.replace(tmp, self._local(name))
        else:
            self._fs.mv(tmp, self._local(name))

    def prune(self, keep: int) -> None:
        """Delete all but the newest `keep` finished checkpoints, and unfinished ones older
        than those (writers that died); never one newer than the newest finished one."""
        names = self.names()
        finished = newest_first(names)
        if len(finished) <= keep:
            return
        oldest_kept = finished[keep - 1][:2]
        for name in sorted(names, key=lambda n: not n.endswith(".json")):  # markers first
            match = _MARKER.match(name) or _DIR.match(name)
            if match and (int(match[1]), int(match[2])) < oldest_kept:
                with contextlib.suppress(FileNotFoundError):  # another rank 0 was first
                    self._fs.rm(self._local(name), recursive=True)

    # --- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The base names in the checkpoint directory; `UntrustedDirectory` for a local one
        another user owns or may write, `FileNotFoundError` when it is missing."""
        if self.local:
            check_directory(self._root)
        return [str(name).rsplit("/", 1)[-1] for name in self._fs.ls(self._root, detail=False)]

    def _read(self, path: str, limit: int) -> bytes:
        if self.local:
            return read_file(path, limit)
        with self._fs.open(path, "rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{path.rsplit('/', 1)[-1]} holds over {limit} bytes")
        return data

    def verify(self, marker_name: str) -> Marker:
        """The marker `marker_name` (a `sharded-...json`), once its checkpoint passes every
        check of the module's docstring; raises `CheckpointUnusable` saying why not."""
        try:
            data = self._read(self._local(marker_name), _MARKER_LIMIT)
            marker = Marker.from_json(marker_name, data)
            directory = self._local(marker.name)
            found = self._files(directory)
            if found != marker.files:
                differ = sorted(set(found.items()) ^ set(marker.files.items()))
                raise CheckpointUnusable(
                    f"{marker.name} does not hold the files its marker lists ({differ[:3]})"
                )
            read_metadata(self._read(f"{directory}/.metadata", _METADATA_LIMIT), marker)
            return marker
        except CheckpointUnusable:
            raise
        except Exception as err:  # a missing file, refused by the owner checks, unreachable
            raise CheckpointUnusable(f"{marker_name}: {type(err).__name__}: {err}") from None

    def _files(self, directory: str) -> dict[str, int]:
        """The entries of a checkpoint's directory with their sizes; for a local one,
        `CheckpointUnusable` for anything but regular files of this user not writable by
        others (a link, a fifo, a file another user may have written)."""
        if not self.local:
            return {
                str(e["name"]).rsplit("/", 1)[-1]: int(e["size"])
                for e in self._fs.ls(directory, detail=True)
            }
        check_directory(directory)
        found = {}
        for name in os.listdir(directory):
            st = os.lstat(os.path.join(directory, name))
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointUnusable(f"{name} in {directory} is not a regular file")
            if st.st_uid != os.geteuid() or st.st_mode & _WRITE_BY_OTHERS:
                raise CheckpointUnusable(
                    f"{name} in {directory} is owned by uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):04o}: another user may have written it"
                )
            found[name] = st.st_size
        return found

    def newest(self) -> tuple[Marker | None, list[str]]:
        """The newest finished checkpoint that verifies, and a line for each newer one passed
        over. Raises `UntrustedDirectory` for a local directory another user owns or may
        write, the filesystem's error when it cannot be listed; `(None, [])` when the
        directory is missing."""
        try:
            names = self.names()
        except FileNotFoundError:
            return None, []
        return choose_newest(names, self.verify)

    def reader(self, marker: Marker) -> Any:
        """DCP's storage reader for `marker`'s checkpoint: one that checks `.metadata`
        (`read_metadata`) unless full pickles are trusted."""
        path = self.path(marker.name)
        base = FileSystemReader if self.local else FsspecReader
        return base(path) if self.trust_pickles else _checked_reader(base, marker)(path)

    def planner(self) -> DefaultLoadPlanner:
        """DCP's load planner: `WeightsOnlyLoadPlanner` unless full pickles are trusted."""
        return DefaultLoadPlanner() if self.trust_pickles else WeightsOnlyLoadPlanner()
