"""The store's directory and index files: owner-only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import StoreError


def private_dir(d: Path) -> Path:
    """Create ``d`` owner-only; chmod it only when its mode is wrong (a read-only disk is the caller's
    to handle: the OSError propagates)."""
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise StoreError(f"{d} is not a directory") from None
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{d} is not a directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    return d


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
