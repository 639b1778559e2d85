"""Documents synced by editors (LSP-style didOpen / didChange / didClose).

The text lives in the engine's per-file state (``engine/files.py``); this
module applies the editors' edits to it, and is the only writer of a document's fields there (text,
version, open, edited): the engine thread writes the others. A batch of edits is applied outside
the engine's global file lock (under a lock for its document only), through a
line index, so one huge document never stalls the other clients.

A refused didOpen or didChange of an open document leaves the daemon with text the editor no
longer has: the document is then out of step, and its edits and completions are refused (with the
first refusal's reason) until a didOpen sends its whole text again.
"""

from __future__ import annotations

import threading
import time
import zlib

from ..engine.files import FileState, Files
from ..errors import DocumentError, InvalidParams
from ..prompt.document import MAX_DOCUMENT_BYTES, LineIndex, offset_of
from .framing import param

MAX_DOCUMENTS = 256
MAX_CHANGES = 10_000
MAX_PATH = 4096
MAX_CHANGE_WORK = 1 << 30  # code points copied by one didChange (the sum of the text's length over its edits)


def position(params: dict, key: str, text: str | LineIndex) -> int:
    """A cursor given as {"line", "character"} (0-based, code points) → offset."""
    pos = param(params, key, dict)
    line = param(pos, "line", int, lo=0, hi=1 << 31)
    char = param(pos, "character", int, lo=0, hi=1 << 31)
    try:
        return text.offset(line, char) if isinstance(text, LineIndex) else offset_of(text, line, char)
    except DocumentError as e:
        raise InvalidParams(f"invalid params: {e}") from None


def name_param(params: dict, key: str, default=...) -> str | None:
    """A path-like string: bounded, no NUL, encodable (no lone surrogate), so it is safe to log, to
    store in the index and to hand to the file system."""
    v = param(params, key, str, default)
    if v is None:
        return v
    if len(v) > MAX_PATH:
        raise InvalidParams(f"invalid params: {key!r} is too long")
    if "\0" in v:
        raise InvalidParams(f"invalid params: {key!r} contains a NUL character")
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidParams(f"invalid params: {key!r} contains a lone surrogate") from None
    return v


def path_param(params: dict) -> str:
    return name_param(params, "path")


def check_size(text: str) -> None:
    """The document limit, in UTF-8 bytes (an astral-plane character is 4); no lone surrogates."""
    if len(text) > MAX_DOCUMENT_BYTES:  # code points <= bytes; cheap first test
        raise InvalidParams(f"invalid params: document larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    if text.isascii():  # O(1): bytes == code points
        return
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidParams(f"invalid params: the text contains a lone surrogate at offset {e.start}") from None
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidParams(f"invalid params: document larger than {MAX_DOCUMENT_BYTES >> 20} MiB (UTF-8)")


# What an editor inserts when the user types an opener (auto-pairs): the caret stays between the two.
AUTO_PAIRS = frozenset({"()", "[]", "{}", '""', "''", "``"})


def kept_lines(old: str, new: str) -> int:
    """How many characters of whole lines (from a line break on) ``new`` kept at its end of ``old``:
    the lines after the caret that an editor sending whole lines sent again."""
    n = min(len(old), len(new))
    i = 0
    while i < n and old[-1 - i] == new[-1 - i]:
        i += 1
    cut = new.find("\n", len(new) - i)  # (a kept closer, as an accept that typed over it, is no line)
    return len(new) - cut if cut >= 0 else 0


def apply_changes(text: str, changes: list) -> tuple[str, int | None]:
    """LSP content changes applied in order (ranges in the text as it is after the earlier ones), and
    where the last one left the caret as typing leaves it (after what it inserted, or between an
    auto-paired opener and its closer; None after a whole-text change). A change that rewrites whole
    lines (Neovim's: "ret\n" becomes "retv\n") leaves it before the line break it kept at its end."""
    index, work, caret = None, 0, None
    for ch in changes:
        if not isinstance(ch, dict):
            raise InvalidParams("invalid params: a content change must be an object")
        new = param(ch, "text", str)
        if "range" in ch:
            work += len(text)
            if work > MAX_CHANGE_WORK:
                raise InvalidParams("invalid params: the changes rewrite too much text; send the whole text")
            if index is None:
                index = LineIndex(text)
            rng = param(ch, "range", dict)
            start, end = position(rng, "start", index), position(rng, "end", index)
            if end < start:
                raise InvalidParams("invalid params: range end before start")
            kept = 0 if new in AUTO_PAIRS else kept_lines(text[start:end], new)
            index.replace(start, end, new)
            text = index.text
            caret = start + (1 if new in AUTO_PAIRS else len(new) - kept)
        else:
            text, index, caret = new, None, None
        if len(text) > MAX_DOCUMENT_BYTES:  # cheap, every change; the exact test once, at the end
            check_size(text)
    check_size(text)
    return text, caret


class Documents:
    """Open documents by path, at most ``limit`` of them."""

    def __init__(self, files: Files, limit: int = MAX_DOCUMENTS):
        self.files, self.limit = files, limit
        self._locks = [threading.Lock() for _ in range(64)]  # per document (striped: bounded)
        self.refused: dict[str, str] = {}  # open documents out of step -> why (under files.lock)

    def lock(self, path: str) -> threading.Lock:
        """Serializes the edits of one document; other documents go on meanwhile."""
        return self._locks[zlib.crc32(path.encode("utf-8", "surrogatepass")) % len(self._locks)]

    def open(self, params: dict) -> FileState:
        path = path_param(params)
        with self.lock(path):
            try:
                text = param(params, "text", str)
                check_size(text)
                version = param(params, "version", int, 0, lo=0, hi=1 << 53)
            except InvalidParams as e:
                self._refuse(path, e)
                raise
            with self.files.lock:
                f = self.files.get(path)
                if (f is None or not f.open) and self.files.n_open() >= self.limit:
                    raise InvalidParams(f"invalid params: more than {self.limit} open documents")
                f = self.files.entry(path)
                f.text, f.version, f.open, f.edited, f.caret = text, version, True, time.monotonic(), None
                self.refused.pop(path, None)
                return f

    def _refuse(self, path: str, e: InvalidParams) -> None:
        """An open document's new text was refused: it is out of step until reopened."""
        with self.files.lock:
            f = self.files.get(path)
            if f is not None and f.open and path not in self.refused:
                self.refused[path] = e.message.removeprefix("invalid params: ")

    def get(self, path: str) -> FileState:
        f = self.files.get(path)
        if f is None or not f.open:
            raise InvalidParams(f"invalid params: document not open: {path}")
        if path in self.refused:
            raise InvalidParams(f"invalid params: document out of step after a refused edit "
                                f"({self.refused[path]}); send didOpen with its whole text: {path}")
        return f

    def text(self, path: str, version: int | None = None) -> str:
        """The open document's text; ``version``: the one the caller expects (else an error)."""
        with self.files.lock:
            f = self.get(path)
            if version is not None and f.version != version:
                raise InvalidParams(f"invalid params: the daemon has version {f.version} of {path}, "
                                    f"not {version}")
            return f.text

    def change(self, params: dict) -> FileState:
        path = path_param(params)
        with self.lock(path):  # the global lock only to read and to store: edits of a huge text take time
            with self.files.lock:
                f = self.get(path)
                text, old_version = f.text, f.version
            try:
                changes = param(params, "contentChanges", list)
                if len(changes) > MAX_CHANGES:
                    raise InvalidParams("invalid params: too many content changes")
                text, caret = apply_changes(text, changes)
                version = param(params, "version", int, old_version + 1, lo=0, hi=1 << 53)
            except InvalidParams as e:
                self._refuse(path, e)
                raise
            with self.files.lock:
                f = self.get(path)  # all changes or none
                f.text, f.version, f.edited, f.caret = text, version, time.monotonic(), caret
                self.files.entry(path)
                return f

    def close(self, params: dict) -> None:
        path = path_param(params)
        with self.lock(path), self.files.lock:
            f = self.files.get(path)
            if f is not None:
                f.open = False
            self.refused.pop(path, None)
