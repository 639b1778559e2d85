"""The store's directory is private, like the daemon's (``daemon/paths.py``): a real directory of
ours, 0700, reached only through directories that no other user can change. Otherwise another user
who pre-created ``$XDG_STATE_HOME/efim`` could replace ``kv`` with a symbolic link to one of our
directories, and the store would chmod it and write its files into it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import StoreError


def private_dir(d: Path) -> Path:
    """``d``, created 0700 if missing. Refused (StoreError, one line) unless it is a directory of
    ours, not a symbolic link, and every directory above it belongs to us or root and is not
    writable by every user (a sticky one, like /tmp, is fine). Ours with another mode: chmod 0700.
    An OSError (mkdir or chmod on a full or read-only disk) is the caller's."""
    d = Path(os.path.abspath(d))
    for above in _above(d):
        _trusted(above)
    missing = []
    p = d
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass  # raced with another process: checked below like any existing directory
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StoreError(f"{d} is not a directory (a symbolic link?); refusing to use it") from None
        raise StoreError(f"cannot use {d}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise StoreError(f"{d} belongs to another user (uid {st.st_uid}); refusing to use it")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return d


def _above(d: Path) -> list[Path]:
    """The directories above ``d``, as written and as resolved (a link on the way is only as safe
    as the directory holding it, and its target as the directories above that)."""
    seen = {}
    for p in (d.parent, Path(os.path.realpath(d.parent))):
        for a in (p, *p.parents):
            seen.setdefault(a, None)
    return list(seen)


def _trusted(p: Path) -> None:
    try:
        st = os.stat(p)
    except OSError:
        return  # missing (created below, ours) or unreadable (mkdir or lstat says so)
    if not stat.S_ISDIR(st.st_mode):
        return
    if st.st_uid not in (0, os.getuid()):
        raise StoreError(f"{p} belongs to another user (uid {st.st_uid}); refusing to keep states under it")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise StoreError(f"{p} is writable by every user; refusing to keep states under it")


def private_file(path: Path, create: bool = True) -> None:
    """Create ``path`` empty and 0600 if missing (never through a symbolic link; not with
    ``create=False``); an existing regular file of ours that others can read is tightened to 0600.
    Anything else is left to the caller (which refuses what is not a regular file)."""
    if not create:
        return _tighten(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        _tighten(path)
        return
    os.close(fd)


def _tighten(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # a symbolic link or unreadable: the caller refuses it
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
