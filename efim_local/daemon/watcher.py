"""Watches workspace roots with watchdog; a file changed on disk refreshes its session. Files under
efim's own directories (``paths.own_dirs``, the state store's) are not the workspace's.

Each directory under a root costs an inotify watch (a per-user kernel budget, often 8192-65536
for all programs): ``/`` and the home directory are refused as roots, and so is a root with more
than ``MAX_DIRS`` directories, counted before it is watched."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ..errors import DocumentError
from ..prompt.document import open_regular

log = logging.getLogger("efim.daemon")
IGNORED_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "build", "dist",
                "target", ".mypy_cache", ".pytest_cache", ".tox", ".idea", ".cache"}
MAX_FILE_BYTES = 1 << 20
MAX_ROOTS = 32  # roots named by editors (each is a watchdog thread); --watch roots come on top
MAX_DIRS = 4096  # directories (inotify watches) under one root
MAX_WATCHES = 16384  # directories under all roots named by editors together


def refusal(root: Path, limit: int = MAX_DIRS) -> tuple[str | None, int]:
    """Why ``root`` (resolved) is not watched (None if it is fine), and its directories (up to
    ``limit`` + 1: the count stops there)."""
    if root == Path(root.anchor) or root == Path.home().resolve():
        return f"{root} is too wide to watch (the file system's root or the home directory)", 0
    n, stack = 0, [str(root)]
    while stack:
        n += 1
        if n > limit:
            return f"{root} has more than {limit} directories; not watching it", n
        try:
            with os.scandir(stack.pop()) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    return None, n


def inside(path: str, dirs) -> bool:
    """Whether ``path`` (resolved) is one of ``dirs`` (resolved) or under one."""
    return any(os.path.commonpath([path, d]) == d for d in dirs)


def interesting(path: str, root: str, ignored=()) -> bool:
    """Source-like files only: inside ``root`` once symlinks are resolved (a link to a file elsewhere
    is not the workspace's), not under ignored directories (``ignored``: resolved paths of efim's
    own), not large, not binary, regular."""
    p = Path(path)
    if any(part in IGNORED_DIRS for part in p.parts) or p.name.endswith((".swp", "~", ".tmp")):
        return False
    real = os.path.realpath(p)
    if not inside(real, [root]) or inside(real, ignored):
        return False
    try:
        fd, st = open_regular(real, follow=False)
    except (DocumentError, OSError):
        return False
    try:
        return st.st_size <= MAX_FILE_BYTES and b"\0" not in os.read(fd, 8192)
    except OSError:
        return False
    finally:
        os.close(fd)


class _Handler(FileSystemEventHandler):
    def __init__(self, callback: Callable[[str], None], root: str, ignored: list[str]):
        self.callback, self.root, self.ignored = callback, root, ignored

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in ("modified", "created", "moved", "closed", "deleted"):
            return
        if event.event_type in ("moved", "deleted"):  # the old path is gone (repository context forgets it)
            old = os.fsdecode(event.src_path)
            where = os.path.realpath(os.path.dirname(old))
            if not any(part in IGNORED_DIRS for part in Path(old).parts) and inside(where, [self.root]) \
                    and not inside(where, self.ignored):
                self.callback(old)
            if event.event_type == "deleted":
                return
        path = getattr(event, "dest_path", "") or event.src_path
        path = os.fsdecode(path)
        if interesting(path, self.root, self.ignored):
            self.callback(path)


class Watcher:
    """Watches workspace roots: those given at start for good, those editors name (didOpen's
    ``root``) at most ``limit``, the least recently named dropped first (each costs a thread)."""

    def __init__(self, callback: Callable[[str], None], roots: list[str] | None = None, limit: int = MAX_ROOTS,
                 ignored=()):
        """``ignored``: directories whose files are never the workspace's (efim's own: ``paths.own_dirs``)."""
        self.observer = Observer()
        self.callback, self.limit = callback, limit
        self.ignored = [os.path.realpath(d) for d in ignored]
        self.lock = threading.Lock()
        self._watches: OrderedDict[str, object] = OrderedDict()  # root -> watchdog's handle, LRU last
        self._dirs: dict[str, int] = {}  # root -> its directories when it was counted
        self._pinned: set[str] = set()
        for r in roots or []:
            self.watch(r, pin=True)

    def watch(self, root: str, pin: bool = False) -> None:
        try:
            resolved = Path(root).resolve()
            if not resolved.is_dir():
                return
        except (OSError, ValueError):  # a NUL, a loop: not a root
            return
        root = str(resolved)
        with self.lock:
            if root in self._watches:
                self._pinned.update([root] if pin else [])
                self._watches.move_to_end(root)
                return
        why, dirs = refusal(resolved)  # outside the lock: counting takes a moment
        if why is not None:
            log.warning("%s", why)
            return
        with self.lock:
            if root in self._watches:
                return
            if pin:
                self._pinned.add(root)
            try:
                handler = _Handler(self.callback, root, self.ignored)  # (the list: later ignore()s reach it)
                self._watches[root] = self.observer.schedule(handler, root, recursive=True)
            except OSError as e:  # out of inotify watches, unreadable: the daemon goes on without it
                log.warning("cannot watch %s: %s", root, e)
                return
            self._dirs[root] = dirs
            log.info("watching %s (%d directories)", root, dirs)
            unpinned = [r for r in self._watches if r not in self._pinned]
            while unpinned and (len(unpinned) > self.limit or
                                sum(self._dirs[r] for r in unpinned) > MAX_WATCHES) and unpinned[0] != root:
                old = unpinned.pop(0)
                self.observer.unschedule(self._watches.pop(old))
                self._dirs.pop(old, None)
                log.info("no longer watching %s (more than %d roots or %d directories)", old, self.limit,
                         MAX_WATCHES)

    def ignore(self, d) -> None:
        """Never take the files under ``d`` for the workspace's (the state store's directory, once the
        engine that configures it is loaded)."""
        with self.lock:
            self.ignored.append(os.path.realpath(d))

    def roots(self) -> list[str]:
        with self.lock:
            return sorted(self._watches)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        if self.observer.is_alive():  # never started when the daemon failed to start
            self.observer.stop()
            self.observer.join(timeout=5)
