"""Attacks through the file system: workspace roots too wide to watch, and the socket's lock file."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from .base import Raw, Target, check, small_complete, status
from .daemon import _serve

WATCH_BUDGET = 16384 + 64  # the daemon's MAX_WATCHES (daemon/watcher.py), and a little slack


def inotify_watches(pid: int) -> int:
    """The inotify watches process ``pid`` holds (from /proc; 0 where it cannot be read)."""
    n = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return 0
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                n += sum(line.startswith("inotify wd:") for line in f)
        except OSError:
            continue
    return n


def wide_roots(t: Target) -> str:
    """didOpen naming ``/``, the home directory and /usr as roots: answered at once, none watched,
    the daemon's inotify watches stay bounded (issue 27: 11 s and 54k watches for ``/``)."""
    pid, home = status(t)["pid"], str(Path.home().resolve())
    before = inotify_watches(pid)
    took = []
    with Raw(t.sock, 60) as c:
        for k, root in enumerate(("/", home, "/usr")):
            path = str(t.tmp / f"wide{k}.py")
            took.append(timed_open(c, path, root))
            c.exchange("didClose", {"path": path})
    st = status(t)
    added = inotify_watches(pid) - before
    check("/" not in st["watching"] and home not in st["watching"], f"watching {st['watching']}")
    check(max(took) < 5, f"a didOpen naming a wide root took {max(took):.1f} s")
    check(added <= WATCH_BUDGET, f"{added} inotify watches added")
    small_complete(t)
    ms = ", ".join(f"{x * 1e3:.0f}" for x in took)
    return f"/, ~ and /usr named: not watched, didOpen in {ms} ms, {added} watches added"


def timed_open(c: Raw, path: str, root: str) -> float:
    t0 = time.monotonic()
    r = c.exchange("didOpen", {"path": path, "text": "x = 1\n", "root": root})
    check("result" in r, f"didOpen with root {root}: {r}")
    return time.monotonic() - t0


def socket_lock(t: Target) -> str:
    """``efim serve --socket`` at a file that is not a socket: refused, and no ``.lock`` left beside it."""
    notes = t.tmp / "lock-notes.txt"
    notes.write_text("my notes\n")
    r = _serve("--socket", str(notes))
    lock = Path(str(notes) + ".lock")
    check(r.returncode == 2, f"--socket at a file: {r.returncode} {r.stderr}")
    check(not lock.exists(), f"{lock} was left behind")
    return "refused; no lock file left"


ATTACKS: dict[str, Callable[[Target], str]] = {f.__name__: f for f in (wide_roots, socket_lock)}
OWN_DAEMON = ("socket_lock",)
