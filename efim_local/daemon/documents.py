"""Documents synced by editors (LSP-style didOpen / didChange / didClose).

The text lives in the engine's per-file state (``engine/files.py``); this
module applies the editors' edits to it.
"""

from __future__ import annotations

from ..engine.files import FileState, Files
from ..errors import DocumentError, InvalidParams
from ..prompt.document import MAX_DOCUMENT_BYTES, offset_of
from .framing import param

MAX_DOCUMENTS = 256
MAX_CHANGES = 10_000
MAX_PATH = 4096


def position(params: dict, key: str, text: str) -> int:
    """A cursor given as {"line", "character"} (0-based, code points) → offset."""
    pos = param(params, key, dict)
    line = param(pos, "line", int, lo=0, hi=1 << 31)
    char = param(pos, "character", int, lo=0, hi=1 << 31)
    try:
        return offset_of(text, line, char)
    except DocumentError as e:
        raise InvalidParams(f"invalid params: {e}") from None


def path_param(params: dict) -> str:
    path = param(params, "path", str)
    if len(path) > MAX_PATH:
        raise InvalidParams("invalid params: 'path' is too long")
    return path


def check_size(text: str) -> None:
    if len(text) > MAX_DOCUMENT_BYTES:  # code points <= bytes; cheap first test
        raise InvalidParams(f"invalid params: document larger than {MAX_DOCUMENT_BYTES >> 20} MiB")


class Documents:
    """Open documents by path, at most ``limit`` of them."""

    def __init__(self, files: Files, limit: int = MAX_DOCUMENTS):
        self.files, self.limit = files, limit

    def open(self, params: dict) -> FileState:
        path = path_param(params)
        text = param(params, "text", str)
        check_size(text)
        version = param(params, "version", int, 0, lo=0, hi=1 << 53)
        with self.files.lock:
            f = self.files.get(path)
            if (f is None or not f.open) and self.files.n_open() >= self.limit:
                raise InvalidParams(f"invalid params: more than {self.limit} open documents")
            f = self.files.entry(path)
            f.text, f.version, f.open = text, version, True
            return f

    def get(self, path: str) -> FileState:
        f = self.files.get(path)
        if f is None or not f.open:
            raise InvalidParams(f"invalid params: document not open: {path}")
        return f

    def text(self, path: str) -> str:
        with self.files.lock:
            return self.get(path).text

    def change(self, params: dict) -> FileState:
        path = path_param(params)
        changes = param(params, "contentChanges", list)
        if len(changes) > MAX_CHANGES:
            raise InvalidParams("invalid params: too many content changes")
        with self.files.lock:
            f = self.get(path)
            text = f.text
            for ch in changes:
                if not isinstance(ch, dict):
                    raise InvalidParams("invalid params: a content change must be an object")
                new = param(ch, "text", str)
                if "range" in ch:
                    rng = param(ch, "range", dict)
                    start, end = position(rng, "start", text), position(rng, "end", text)
                    if end < start:
                        raise InvalidParams("invalid params: range end before start")
                    text = text[:start] + new + text[end:]
                else:
                    text = new
                check_size(text)
            version = param(params, "version", int, f.version + 1, lo=0, hi=1 << 53)
            f.text, f.version = text, version  # all changes or none
            self.files.entry(path)
            return f

    def close(self, params: dict) -> None:
        path = path_param(params)
        with self.files.lock:
            f = self.files.get(path)
            if f is not None:
                f.open = False
