"""Where the daemon keeps its socket, pid file, lock and log, and how they are opened.

The state and runtime directories are private (0700, ours): a directory another user created
or can write to could hold symlinks that make us overwrite or append to files of theirs choosing.
Files in them are opened without following symlinks, mode 0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..config import cache_home, config_home, state_home
from ..errors import ConfigError


def private_dir(d: Path) -> Path:
    """``d``, created 0700 if missing; refused (one line) unless it is a real directory of ours that
    no one else can write to. Ours but readable by others (older versions made it 0755): tightened."""
    if not d.exists():
        d.mkdir(parents=True, mode=0o700)
    try:
        st = os.lstat(d)
    except OSError as e:
        raise ConfigError(f"cannot use {d}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{d} is not a directory (a symbolic link?); refusing to use it")
    if st.st_uid != os.getuid():
        raise ConfigError(f"{d} belongs to another user (uid {st.st_uid}); refusing to use it")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    return d


def open_private(path: Path, flags: int) -> int:
    """A file descriptor on ``path`` (created 0600), never through a symbolic link."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ConfigError(f"cannot open {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        _ours(path, st)
    except BaseException:
        os.close(fd)
        raise
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def check_private(path: Path) -> None:
    """Refuse early (one line) what ``open_private`` would refuse later: a link, another's file."""
    try:
        _ours(path, os.lstat(path))
    except FileNotFoundError:
        pass


def _ours(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a regular file of yours (a symbolic link?); refusing to use it")


def write_private(path: Path, text: str) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/efim`` (or a directory under the user's cache), private."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return private_dir(Path(base) / "efim" if base else cache_home() / "run")


def socket_path() -> Path:
    return Path(os.environ["EFIM_SOCKET"]) if os.environ.get("EFIM_SOCKET") else runtime_dir() / "efim.sock"


def pid_file() -> Path:
    return _state() / "daemon.pid"


def log_file() -> Path:
    return _state() / "daemon.log"


def _state() -> Path:
    return private_dir(state_home())


def own_dirs() -> list[Path]:
    """The directories efim writes to (its log, pid file, saved states, socket, caches) or reads its
    configuration from: a watched workspace that holds them must not take efim's own writes for the
    user's (each line logged would refresh a file, and stop the idle work that logs the next)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return [state_home(), cache_home(), config_home()] + ([Path(runtime) / "efim"] if runtime else [])
