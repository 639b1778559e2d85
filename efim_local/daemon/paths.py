"""Where the daemon keeps its socket, pid file, lock and log."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import cache_home, state_home


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/efim`` (or a directory under the user's cache), created 0700."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "efim" if base else cache_home() / "run"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    return d


def socket_path() -> Path:
    return Path(os.environ["EFIM_SOCKET"]) if os.environ.get("EFIM_SOCKET") else runtime_dir() / "efim.sock"


def pid_file() -> Path:
    return _state() / "daemon.pid"


def log_file() -> Path:
    return _state() / "daemon.log"


def _state() -> Path:
    d = state_home()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d
