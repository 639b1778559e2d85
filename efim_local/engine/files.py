"""Per-file state, in one place: the document's text, its cursor and its planning session.

One writer per field (tests/engine/test_one_writer.py records the writing thread of every field while a daemon
serves opens, edits, cursor notes, requests and growth):

- the **document** (``text``, ``version``, ``open``, ``edited``): the connection thread that applies the
  editor's didOpen/didChange/didClose (``daemon/documents.py``, one message at a time, under the
  document's lock and :attr:`Files.lock`). The editor's keystroke is applied before its completion
  request is read on that same connection, so no hop to the engine thread delays it. (A document two
  connections edit, or one closes that another opened, has their threads take turns under its lock.);
- everything **planning** reads (``seen``, ``cursor``, ``touched``, ``near_until``, ``session`` and the
  :class:`FileSession` in it: anchor, typed text, lead, note): the engine thread alone (a daemon's
  cursor note is posted to it: ``Scheduler.post``).

Readers on the other side read a field at a time (under :attr:`Files.lock` where two must agree). Which
slot holds a file's KV is the slot's own record (``Slot.path``), looked up by path.
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
    # -- the document: written by the connection thread that applies the editor's messages
    text: str | None = None  # an open document's current text (after didClose: its last one)
    version: int = 0
    open: bool = False  # synced by an editor (didOpen ... didClose)
    edited: float = 0.0  # when the editor last opened or changed it (monotonic)
    caret: int | None = None  # where its last edit left the caret, as typing does (documents.apply_changes)
    # -- planning: written by the engine thread only
    seen: str | None = None  # the text of the latest request (a file no editor syncs has no other)
    cursor: int | None = None  # the last completion's cursor offset, or the editor's settled cursor
    session: FileSession | None = None  # the planner's anchor
    touched: float = field(default_factory=time.monotonic)  # the latest request or plan (monotonic)
    near_until: float = 0.0  # no new near plan before this (monotonic): the window's growth has its turn

    @property
    def current(self) -> str | None:
        """The file's text as the user last had it: the open document's, else the latest request's."""
        if self.open or self.seen is None:
            return self.text
        return self.seen

    @property
    def used(self) -> float:
        """When the user last used the file: a request, an open, an edit (monotonic)."""
        return max(self.touched, self.edited)


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
        """The file's state, created if new (most recently used last). Writes no field: each side
        notes its own use (``touched``, ``edited``)."""
        with self.lock:
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = FileState(path)
                self._trim()
            else:
                self._files.move_to_end(path)
            return f

    # -- the engine thread ---------------------------------------------------------------------
    def session(self, path: str, layout: str) -> FileSession:
        """The planning session (anchor, layout) of a file, created with ``layout`` if new."""
        with self.lock:
            f = self.entry(path)
            f.touched = time.monotonic()
            if f.session is None:
                f.session = FileSession(layout=layout)
            return f.session

    def note_request(self, path: str, text: str, cursor: int) -> None:
        """A request at ``cursor`` on ``text``: remember both."""
        with self.lock:
            f = self.entry(path)
            f.cursor, f.seen, f.touched = cursor, text, time.monotonic()

    def note_cursor(self, path: str, cursor: int) -> None:
        """The editor's cursor settled at ``cursor`` in an open document (its next idle prefill's)."""
        with self.lock:
            f = self._files.get(path)
            if f is not None:
                f.cursor = cursor

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
