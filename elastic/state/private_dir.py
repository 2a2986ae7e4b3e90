"""A local checkpoint directory that only its owner can write.

Whoever can write a checkpoint directory decides what the next job resumes from, so a local
one must be this process's own: it is made 0700 and its files 0600; an existing directory
owned by another user, or writable by its group or by others, is refused (`UntrustedDirectory`),
and so is a file in it that is a symbolic link, not a regular file, or that another user may
have written (`UntrustedFile`). A symbolic link naming the directory itself is the user's
choice: its target is what is checked.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO

from elastic.errors import ElasticError

_WRITE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class UntrustedDirectory(ElasticError, PermissionError):
    """A local checkpoint directory that another user owns or may write; the message names
    it, its owner and mode, and how to fix it."""


class UntrustedFile(ElasticError, PermissionError):
    """A file of the checkpoint directory that is a symbolic link, not a regular file, or
    owned by another user or writable by others."""


def _who(st: os.stat_result) -> str:
    return f"owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}"


def check_directory(path: str) -> None:
    """Raise `UntrustedDirectory` unless `path` is a directory owned by this process's
    effective uid and not writable by group or others; `FileNotFoundError` when it is
    missing."""
    st = os.stat(path)
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"checkpoint directory {path} is not a directory")
    if st.st_uid == uid and not st.st_mode & _WRITE_BY_OTHERS:
        return
    fixes = []
    if st.st_uid != uid:
        fixes.append(f"chown {uid} {path}")
    if st.st_mode & _WRITE_BY_OTHERS:
        fixes.append(f"chmod go-w {path}")
    raise UntrustedDirectory(
        f"checkpoint directory {path} is {_who(st)} (this process runs as uid {uid}): "
        "whoever else can write it could plant the checkpoint the next job resumes from, so "
        f"it is not used; run '{' && '.join(fixes)}', or name a directory of your own"
    )


def make_directory(path: str) -> None:
    """Make `path` (mode 0700) unless it exists, then `check_directory` it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_directory(path)


def create_file(path: str) -> BinaryIO:
    """A new file at `path`, mode 0600, open for writing; `FileExistsError` when something
    (a file, a link) is there already."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def read_file(path: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file `path`, never following a symbolic link, and never
    waiting on a FIFO. Raises `UntrustedFile` for a link, anything but a regular file, or a
    file owned by another user or writable by others; `ValueError` when it holds more than
    `limit` bytes; `OSError` (`FileNotFoundError`...) when it cannot be read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if os.path.islink(path):
            raise UntrustedFile(f"{os.path.basename(path)} is a symbolic link") from err
        raise
    with contextlib.closing(os.fdopen(fd, "rb")) as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{os.path.basename(path)} is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & _WRITE_BY_OTHERS:
            raise UntrustedFile(
                f"{os.path.basename(path)} is {_who(st)}: another user may have written it"
            )
        if limit is not None and st.st_size > limit:
            raise ValueError(f"{os.path.basename(path)} holds {st.st_size} bytes, over {limit}")
        return file.read()
