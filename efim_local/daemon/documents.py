"""Documents synced by editors (LSP-style didOpen / didChange / didClose)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..document import MAX_DOCUMENT_BYTES, DocumentError, offset_of
from .protocol import INVALID_PARAMS, RpcError, get

MAX_DOCUMENTS = 256
MAX_CHANGES = 10_000


@dataclass
class Document:
    path: str
    text: str
    version: int = 0
    touched: float = field(default_factory=time.monotonic)


def position(params: dict, key: str, text: str) -> int:
    """A cursor given as {"line", "character"} (0-based, code points) → offset."""
    pos = get(params, key, dict)
    line = get(pos, "line", int, lo=0, hi=1 << 31)
    char = get(pos, "character", int, lo=0, hi=1 << 31)
    try:
        return offset_of(text, line, char)
    except DocumentError as e:
        raise RpcError(INVALID_PARAMS, f"invalid params: {e}") from None


def _check_size(text: str) -> None:
    if len(text) > MAX_DOCUMENT_BYTES:  # code points <= bytes; cheap first test
        raise RpcError(INVALID_PARAMS, f"invalid params: document larger than {MAX_DOCUMENT_BYTES >> 20} MiB")


class Documents:
    """Open documents by path, at most ``limit`` of them."""

    def __init__(self, limit: int = MAX_DOCUMENTS):
        self.limit = limit
        self.docs: dict[str, Document] = {}

    def open(self, params: dict) -> Document:
        path = get(params, "path", str)
        text = get(params, "text", str)
        _check_size(text)
        if path not in self.docs and len(self.docs) >= self.limit:
            raise RpcError(INVALID_PARAMS, f"invalid params: more than {self.limit} open documents")
        doc = Document(path, text, get(params, "version", int, 0, lo=0, hi=1 << 53))
        self.docs[path] = doc
        return doc

    def get(self, path: str) -> Document:
        doc = self.docs.get(path)
        if doc is None:
            raise RpcError(INVALID_PARAMS, f"invalid params: document not open: {path}")
        return doc

    def change(self, params: dict) -> Document:
        doc = self.get(get(params, "path", str))
        changes = get(params, "contentChanges", list)
        if len(changes) > MAX_CHANGES:
            raise RpcError(INVALID_PARAMS, "invalid params: too many content changes")
        text = doc.text
        for ch in changes:
            if not isinstance(ch, dict):
                raise RpcError(INVALID_PARAMS, "invalid params: a content change must be an object")
            new = get(ch, "text", str)
            if "range" in ch:
                rng = get(ch, "range", dict)
                start, end = position(rng, "start", text), position(rng, "end", text)
                if end < start:
                    raise RpcError(INVALID_PARAMS, "invalid params: range end before start")
                text = text[:start] + new + text[end:]
            else:
                text = new
            _check_size(text)
        doc.text, doc.touched = text, time.monotonic()
        doc.version = get(params, "version", int, doc.version + 1, lo=0, hi=1 << 53)
        return doc

    def close(self, params: dict) -> None:
        self.docs.pop(get(params, "path", str), None)
