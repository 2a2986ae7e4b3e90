"""Folders and files only this user can reach, opened without following symbolic links.

Worker output lands under shared places (`$TMPDIR`, a user's `--output-filename` folder)
where another local user may have planted a folder or a link beforehand. These functions
never follow a link in the last component of a path, refuse what belongs to another user,
and tighten the modes of what this user already owns. Every refusal is a `LaunchError`
whose message (one line) names the path and says what to do.
"""

from __future__ import annotations

import errno
import os
import stat

from elastic.driver.errors import LaunchError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: str, mode: int = PRIVATE_DIR) -> None:
    """Make `path` a folder of this user with exactly `mode` (default 0700).

    A missing folder is created (its parent must exist). An existing one is kept when it is
    a real folder owned by this user, its mode set to `mode`. Raises `LaunchError` when
    `path` is a symbolic link, not a folder, owned by another user, or cannot be created.
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError as err:
        raise LaunchError(f"cannot create {path}: {err.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LaunchError(
                f"{path} is a symbolic link or not a folder: refusing to use it (remove it first)"
            ) from None
        raise LaunchError(f"cannot open {path}: {err.strerror}") from None
    try:
        _check_owner(fd, path)
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def open_private(
    path: str, flags: int = os.O_WRONLY | os.O_APPEND, mode: int = PRIVATE_FILE
) -> int:
    """A file descriptor on the regular file `path`, created with `mode` (default 0600) if
    missing; an existing file of this user gets `mode` too. `flags` are `os.open` flags
    (default: append); O_CREAT, O_NOFOLLOW and O_CLOEXEC are added.

    Raises `LaunchError` when `path` is a symbolic link, not a regular file, owned by another
    user, or cannot be opened. The caller closes the descriptor.
    """
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LaunchError(
                f"{path} is a symbolic link: refusing to write through it (remove it)"
            ) from None
        raise LaunchError(f"cannot open {path}: {err.strerror}") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise LaunchError(f"{path} is not a regular file: refusing to write to it")
        _check_owner(fd, path)
        if stat.S_IMODE(found.st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_owner(fd: int, path: str) -> None:
    owner, me = os.fstat(fd).st_uid, os.geteuid()
    if owner != me:
        raise LaunchError(
            f"{path} belongs to uid {owner}, not to this user (uid {me}): refusing to use it "
            "(another user may have planted it; remove it first)"
        )
