"""Starting the daemon in the background (``efim daemon start`` and ``efim lsp`` use this).

The daemon is ``efim serve --config-stdin`` in a new session; its output goes to ``daemon.log``.
When it exits before it answers, the error says why: the lines it wrote to the log (its own
one-line error), not only where the log is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..errors import AlreadyRunning, DaemonError
from . import client, paths

MAX_REASON = 300  # characters of the daemon's last words quoted in the error


def start_daemon(timeout: float, cfg, roots=(), verbose: bool = False) -> int:
    """Start ``efim serve`` in the background with configuration ``cfg``; returns its pid. It logs
    to ``daemon.log`` in the state directory (rotated; debug messages with ``verbose``)."""
    if client.running():
        raise AlreadyRunning(f"an efim daemon is already running on {paths.socket_path()}")
    settings = {"config": cfg.resolved().to_json(), "watch": [str(Path(r).resolve()) for r in roots],
                "log": str(paths.log_file()), "verbose": verbose}
    # -P: the caller's working directory is not on sys.path (a local logging.py must not shadow ours).
    args = [sys.executable, "-P", "-m", "efim_local.cli", "serve", "--config-stdin"]
    log = os.fdopen(paths.open_private(paths.log_file(), os.O_WRONLY | os.O_APPEND), "ab")
    start = log.seek(0, os.SEEK_END)  # what this start writes to the log begins here
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                            cwd=paths.log_file().parent)
    log.close()  # the child has its own copy
    proc.stdin.write(json.dumps(settings).encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.running():
            return proc.pid
        if proc.poll() is not None:
            reason = last_error(paths.log_file(), start)
            why = f": {reason}" if reason else ""
            raise DaemonError(f"the daemon exited with code {proc.returncode}{why} (log: {paths.log_file()})")
        time.sleep(0.1)
    raise DaemonError(f"the daemon did not answer within {timeout:.0f} s (last log line: "
                      f"{last_error(paths.log_file(), start) or 'nothing logged'}; log: {paths.log_file()})")


def last_error(log: Path, start: int = 0) -> str:
    """The last error line the daemon wrote to ``log`` after byte ``start`` ("" if none): its
    one-line ``efim: error: ...`` or a logged ERROR, else its last line."""
    try:
        with os.fdopen(os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            f.seek(start if os.fstat(f.fileno()).st_size >= start else 0)  # rotated meanwhile: all of it
            tail = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    line = (errors or lines or [""])[-1]
    for prefix in ("efim: error: ",):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line[:MAX_REASON]
