"""Watches workspace roots with watchdog; a file changed on disk refreshes its session."""

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


def interesting(path: str, root: str) -> bool:
    """Source-like files only: inside ``root`` once symlinks are resolved (a link to a file elsewhere
    is not the workspace's), not under ignored directories, not large, not binary, regular."""
    p = Path(path)
    if any(part in IGNORED_DIRS for part in p.parts) or p.name.endswith((".swp", "~", ".tmp")):
        return False
    real = os.path.realpath(p)
    if os.path.commonpath([real, root]) != root:
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
    def __init__(self, callback: Callable[[str], None], root: str):
        self.callback, self.root = callback, root

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in ("modified", "created", "moved", "closed"):
            return
        path = getattr(event, "dest_path", "") or event.src_path
        path = os.fsdecode(path)
        if interesting(path, self.root):
            self.callback(path)


class Watcher:
    """Watches workspace roots: those given at start for good, those editors name (didOpen's
    ``root``) at most ``limit``, the least recently named dropped first (each costs a thread)."""

    def __init__(self, callback: Callable[[str], None], roots: list[str] | None = None, limit: int = MAX_ROOTS):
        self.observer = Observer()
        self.callback, self.limit = callback, limit
        self.lock = threading.Lock()
        self._watches: OrderedDict[str, object] = OrderedDict()  # root -> watchdog's handle, LRU last
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
            if pin:
                self._pinned.add(root)
            if root in self._watches:
                self._watches.move_to_end(root)
                return
            try:
                self._watches[root] = self.observer.schedule(_Handler(self.callback, root), root, recursive=True)
            except OSError as e:  # out of inotify watches, unreadable: the daemon goes on without it
                log.warning("cannot watch %s: %s", root, e)
                return
            log.info("watching %s", root)
            unpinned = [r for r in self._watches if r not in self._pinned]
            for old in unpinned[:max(0, len(unpinned) - self.limit)]:
                self.observer.unschedule(self._watches.pop(old))
                log.info("no longer watching %s (more than %d roots)", old, self.limit)

    def roots(self) -> list[str]:
        with self.lock:
            return sorted(self._watches)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        if self.observer.is_alive():  # never started when the daemon failed to start
            self.observer.stop()
            self.observer.join(timeout=5)
