"""Per-file state, in one place: the document's text, its cursor and its planning session.

The one writer: every change goes through a method of :class:`Files`, under its
lock. The engine notes each request's cursor (and the text of a file no editor
syncs); the daemon edits the text of open documents (didOpen/didChange). The
planning session (anchor, typed text) is the engine thread's own. Which slot
holds a file's KV is the slot's own record (``Slot.path``), looked up by path.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from ..prompt.planner import FileSession

MAX_FILES = 1024  # entries kept for closed files (their sessions); open documents are never dropped


@dataclass
class FileState:
    path: str
    text: str | None = None  # the last text seen (an open document's current text)
    version: int = 0
    cursor: int | None = None  # the last completion's cursor offset
    session: FileSession | None = None  # the planner's anchor (engine thread only)
    open: bool = False  # synced by an editor (didOpen ... didClose)
    touched: float = field(default_factory=time.monotonic)
    near_until: float = 0.0  # no new near plan before this (monotonic): the window's growth has its turn


class Files:
    """Files by path; thread-safe. Closed files beyond ``limit`` are forgotten, oldest first."""

    def __init__(self, limit: int = MAX_FILES):
        self.limit = limit
        self.lock = threading.RLock()
        self._files: OrderedDict[str, FileState] = OrderedDict()

    def get(self, path: str) -> FileState | None:
        with self.lock:
            return self._files.get(path)

    def entry(self, path: str) -> FileState:
        """The file's state, created if new (most recently used last)."""
        with self.lock:
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = FileState(path)
                self._trim()
            else:
                self._files.move_to_end(path)
            f.touched = time.monotonic()
            return f

    def session(self, path: str, layout: str) -> FileSession:
        """The planning session (anchor, layout) of a file, created with ``layout`` if new."""
        with self.lock:
            f = self.entry(path)
            if f.session is None:
                f.session = FileSession(layout=layout)
            return f.session

    def note_request(self, path: str, text: str, cursor: int) -> None:
        """A request at ``cursor``: remember it (and the text, unless an editor syncs the document)."""
        with self.lock:
            f = self.entry(path)
            f.cursor = cursor
            if not f.open:  # an open document's text is the editor's to change
                f.text = text

    def set_anchor(self, path: str, anchor) -> None:
        """The file's plan is anchored on ``anchor``: grown (growth finished, or a keystroke took its
        progress so far)."""
        with self.lock:
            f = self._files.get(path)
            if f is not None and f.session is not None:
                f.session.anchor = anchor

    def set_typed(self, path: str, typed: list[int]) -> None:
        """The tokens typed since the anchor, as the last plan tokenized them (growth computes them too)."""
        with self.lock:
            f = self._files.get(path)
            if f is not None and f.session is not None:
                f.session.typed = typed

    def forget_session(self, path: str) -> None:
        """The file changed outside the editor: plan it afresh next time."""
        with self.lock:
            f = self._files.get(path)
            if f is not None:
                f.session = None

    def open_paths(self) -> list[str]:
        with self.lock:
            return [p for p, f in self._files.items() if f.open]

    def n_open(self) -> int:
        with self.lock:
            return sum(f.open for f in self._files.values())

    def _trim(self) -> None:
        extra = len(self._files) - self.limit
        for path in [p for p, f in self._files.items() if not f.open][:max(0, extra)]:
            del self._files[path]
