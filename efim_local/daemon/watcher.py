"""Watches workspace roots with watchdog; a file changed on disk refreshes its session."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger("efim.daemon")
IGNORED_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "build", "dist",
                "target", ".mypy_cache", ".pytest_cache", ".tox", ".idea", ".cache"}
MAX_FILE_BYTES = 1 << 20


def interesting(path: str) -> bool:
    """Source-like files only: not under ignored directories, not large, not binary."""
    p = Path(path)
    if any(part in IGNORED_DIRS for part in p.parts) or p.name.endswith((".swp", "~", ".tmp")):
        return False
    try:
        if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
            return False
        with open(p, "rb") as f:
            return b"\0" not in f.read(8192)
    except OSError:
        return False


class _Handler(FileSystemEventHandler):
    def __init__(self, callback: Callable[[str], None]):
        self.callback = callback

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in ("modified", "created", "moved", "closed"):
            return
        path = getattr(event, "dest_path", "") or event.src_path
        path = os.fsdecode(path)
        if interesting(path):
            self.callback(path)


class Watcher:
    def __init__(self, callback: Callable[[str], None], roots: list[str] | None = None):
        self.observer = Observer()
        self.handler = _Handler(callback)
        self._roots: set[str] = set()
        for r in roots or []:
            self.watch(r)

    def watch(self, root: str) -> None:
        root = str(Path(root).resolve())
        if root in self._roots or not Path(root).is_dir():
            return
        self._roots.add(root)
        self.observer.schedule(self.handler, root, recursive=True)
        log.info("watching %s", root)

    def roots(self) -> list[str]:
        return sorted(self._roots)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        if self.observer.is_alive():  # never started when the daemon failed to start
            self.observer.stop()
            self.observer.join(timeout=5)
