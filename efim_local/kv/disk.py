"""The disk tier: one state file per state (``states/<id>.kv``, its InfiniGen partial keys beside it
as ``<id>.pk``), under ``disk_mb``. Making room evicts the least valuable states; a long state with
partial keys is first shrunk to its most-selected cells when the sparse bookkeeping says so.

File names come from state ids (hashes), never from paths; every file is opened without following
symbolic links (``stateformat``).
"""

from __future__ import annotations

import logging
import stat
from collections import Counter
from pathlib import Path

import numpy as np

from . import stateformat
from .index import Index, valid_id
from .sparse.book import SparseBook
from .tier import MB, Entry, Kind, alive, value
from ..errors import StateFileError

log = logging.getLogger("efim.store")


def max_file_bytes(disk_mb: float) -> int:
    """No state file is larger than the disk budget (a bigger one was never written by us)."""
    return int(disk_mb * MB) + (64 << 20)


def _tmp_owner(p: Path) -> int:
    """The pid in a temp file name ``<id>.kv.<pid>.tmp``."""
    try:
        return int(p.name.rsplit(".", 2)[-2])
    except (ValueError, IndexError):
        return 0


def _regular(p: Path) -> bool:
    return stat.S_ISREG(p.lstat().st_mode)


class DiskTier:
    name = "disk"

    def __init__(self, files: Path, disk_mb: float, index: Index, kind: Kind, book: SparseBook,
                 counts: Counter):
        self.files, self.index, self.kind, self.book, self.counts = files, index, kind, book, counts
        self.budget = disk_mb * MB
        self.max_bytes = max_file_bytes(disk_mb)

    def file_of(self, state_id: str) -> Path:
        if not valid_id(state_id):
            raise StateFileError("corrupt", f"invalid state id {state_id[:40]!r}")
        return self.files / f"{state_id}.kv"

    def partial_of(self, state_id: str) -> Path:
        """The partial-keys sidecar beside a state file (InfiniGen)."""
        return self.file_of(state_id).with_suffix(".pk")

    # -- the tier interface ---------------------------------------------------------------
    def tokens(self, state_id: str) -> np.ndarray:
        k = self.kind
        return stateformat.read_tokens(self.file_of(state_id), k.model, k.layout, self.max_bytes)[1]

    def read(self, state_id: str) -> tuple[np.ndarray, bytes]:
        _, toks, payload = stateformat.read(self.file_of(state_id), self.kind.model, self.kind.layout,
                                            self.max_bytes)
        return toks, payload

    def partial(self, state_id: str, max_bytes: int = 1 << 30) -> bytes | None:
        try:
            with stateformat.open_regular(self.partial_of(state_id), max_bytes) as f:
                return f.read(max_bytes + 1)
        except (StateFileError, OSError):
            return None

    def add(self, e: Entry) -> None:
        k = self.kind
        size = stateformat.encoded_size(e.tokens, e.payload, k.params)
        if size > self.budget:
            self.index.remove(e.id, evicted=True)
            return
        self.make_room(size)
        stateformat.write(self.file_of(e.id), e.tokens, e.payload, k.model, k.layout, k.params)
        if e.partial:
            stateformat.write_private(self.partial_of(e.id), e.partial)
        self.index.add(k.row(e, "disk", size), e.tokens)

    def make_room(self, size: int) -> None:
        rows = self.index.rows("disk")
        used = sum(r["bytes"] for r in rows)
        for r in sorted(rows, key=lambda r: value(r["last_used"], r["hits"], r["n_tokens"])):
            if used + size <= self.budget:
                break
            if r["kept"] >= 1 and self._shrink(r):  # keep its partial form instead
                new = self.index.get(r["id"])
                used -= r["bytes"] - new["bytes"]
                if used + size <= self.budget:
                    break
                r = new
            used -= r["bytes"]
            self.remove(r["id"])
            self.index.remove(r["id"], evicted=True)
            self.counts["evicted_disk"] += 1

    def remove(self, state_id: str) -> None:
        if valid_id(state_id):  # an id that is not a hash names no file of ours (`../../victim`)
            stateformat.remove(self.file_of(state_id))
            stateformat.remove(self.partial_of(state_id))

    def used(self) -> int:
        return sum(r["bytes"] for r in self.index.rows("disk"))

    def clear(self) -> None:
        for p in self.files.iterdir():
            stateformat.remove(p)

    # -- shrinking and upkeep -------------------------------------------------------------
    def _shrink(self, row: dict) -> bool:
        """Rewrite a long state with only its most-selected cells; False if it does not apply."""
        if not self.book.shrinks(row["n_tokens"]) or not self.partial_of(row["id"]).exists():
            return False
        k = self.kind
        try:
            _, toks, payload = stateformat.read(self.file_of(row["id"]), k.model, k.layout)
        except (StateFileError, OSError):
            return False
        out = self.book.shrink(row["id"], payload, self.partial(row["id"]))
        if out is None:
            return False
        payload, partial = out
        self.remove(row["id"])
        size = stateformat.write(self.file_of(row["id"]), toks, payload, k.model, k.layout, k.params)
        if partial:
            stateformat.write_private(self.partial_of(row["id"]), partial)
        self.index.add({**row, "bytes": size, "kept": self.book.shrink_to}, toks)
        self.counts["shrunk_disk"] += 1
        return True

    def drop_temp(self) -> int:
        """Remove the temp files of saves that were interrupted (their process is gone)."""
        n = 0
        for p in self.files.glob("*.tmp"):
            if not alive(_tmp_owner(p)):
                stateformat.remove(p)
                n += 1
        return n

    def state_files(self) -> dict[str, Path]:
        """State files by id; only regular files count (a directory, FIFO or link is not one)."""
        return {p.stem: p for p in self.files.glob("*.kv") if _regular(p)}

    def reconcile(self, rows: dict[str, dict], files: dict[str, Path]) -> Counter:
        """Remove files no disk row names (given the rows and ``state_files()`` read before)."""
        out = Counter()
        for p in self.files.glob("*.kv"):
            r = rows.get(p.stem)
            if r is None or r["tier"] != "disk" or not _regular(p):
                stateformat.remove(p)
                out["files_without_row"] += 1
        for p in self.files.glob("*.pk"):
            if p.stem not in files or p.stem not in rows or not _regular(p):
                stateformat.remove(p)
                out["files_without_row"] += 1
        out["temp_files"] = self.drop_temp()
        return out


def rebuild(files: Path, index: Index, max_bytes: int) -> int:
    """Add a row for every readable state file in ``files`` (any model: the header names it); drop
    the rest. Paths and hit counts are not in the files, so they start empty."""
    n = 0
    for p in files.glob("*.kv"):
        sid = p.name[:-3]
        try:
            if not valid_id(sid):
                raise StateFileError("corrupt", "not a state file name")
            head, toks = stateformat.read_tokens(p, max_bytes=max_bytes)
            with stateformat.open_regular(p) as f:  # a shrunk state holds fewer cells than tokens
                f.seek(p.stat().st_size - head.payload_len)
                cells = int.from_bytes(f.read(4), "little")
        except (StateFileError, OSError) as e:
            log.warning("dropping state file %s: %s", p.name, e)
            stateformat.remove(p)
            stateformat.remove(p.with_suffix(".pk"))
            continue
        st = p.stat()
        index.add({"id": sid, "path": "", "content_hash": "", "model": head.model.hex(),
                   "layout": head.layout.hex(), "n_tokens": len(toks), "bytes": st.st_size, "tier": "disk",
                   "created": st.st_mtime, "last_used": st.st_mtime, "hits": 0, "owner": 0,
                   "kept": 1.0 if cells >= len(toks) else cells / max(1, len(toks))}, toks)
        n += 1
    log.info("state index rebuilt: %d states", n)
    return n
