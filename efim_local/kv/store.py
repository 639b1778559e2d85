"""StateStore: saved KV states in host RAM and on disk, under MB budgets.

Tiers: live slots (the engine's) → RAM (normalized ``llama_state_seq_get_data`` bytes, ``ram.py``)
→ disk (state files, ``disk.py``) → deleted. The store composes the two tiers over one SQLite index
and decides what to look up, restore, save and drop; the tiers hold the data and keep their budgets
(a state enters a tier only after room was made for it). Sparse restores' bookkeeping lives in
``sparse/book.py``; what it needs from the model (the shrink function) is passed to ``open``.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .events import MISS_REASONS, Event, counter_names
from .prefix import common_prefix
from . import kvblob, stateformat
from .disk import DiskTier, max_file_bytes, rebuild
from .fingerprint import model_fingerprint
from .index import Index, IndexCorrupt, valid_id
from .private import private_dir
from .ram import RamTier
from .sparse.book import ShrinkFn, SparseBook
from .tier import MB, Entry, Kind, Tier
from ..errors import StateFileError, StoreError, one_line

log = logging.getLogger("efim.store")

__all__ = ["Entry", "Lookup", "Match", "StateStore", "StoreConfig"]


@dataclass(frozen=True)
class StoreConfig:
    dir: Path
    ram_mb: float = 512.0
    disk_mb: float = 4096.0
    min_tokens: int = 64  # shorter states are not worth saving
    # Disk pressure: a state of at least shrink_min_tokens with partial keys is first shrunk to
    # this fraction of its cells (the most often selected ones) before it is evicted. 0: off.
    shrink_to: float = 0.0
    shrink_min_tokens: int = 4096


@dataclass
class Match:
    id: str
    n: int  # tokens usable from this state
    tier: str  # "ram" | "disk"
    tokens: np.ndarray  # all of the state's tokens
    kept: float = 1.0  # < 1: a shrunk, approximate state (sparse restores only)


@dataclass
class Lookup:
    match: Match | None
    miss_reason: str | None = None


_READONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


class StateStore:
    """The store in ``cfg.dir`` for states of one model (``model``: its fingerprint) and KV layout.
    ``whole_state_only``: sliding-window models restore whole states, never truncated ones.
    ``shrink``: ``SparseMode.shrink``, to shrink long states under disk pressure (``cfg.shrink_to``).
    Raises StoreError (one line) when the directory cannot be used; see ``open``."""

    def __init__(self, cfg: StoreConfig, model: bytes, layout: bytes, layout_params: dict,
                 whole_state_only: bool = False, shrink: ShrinkFn | None = None):
        self.cfg, self.whole_state_only = cfg, whole_state_only
        self.kind = Kind(model, layout, layout_params)
        self._model_hex, self._layout_hex = self.kind.model_hex, self.kind.layout_hex
        self.counts: Counter = Counter()
        self.book = SparseBook(shrink, cfg.shrink_to, cfg.shrink_min_tokens)
        self.dir = Path(cfg.dir)
        files = self.dir / "states"
        self.readonly = False  # a read-only disk: restore what is saved, save nothing
        self.bad: set[str] = set()  # states found unusable that could not be deleted (read-only)
        self._warned: set = set()
        try:
            for d in (self.dir, files):
                private_dir(d)
        except OSError as e:
            if e.errno not in _READONLY or not files.is_dir() or files.is_symlink():
                raise StoreError(f"state store {self.dir}: {e.strerror or e}") from None
            self.readonly = True
        self.readonly = self.readonly or not os.access(files, os.W_OK)
        self.index = self._open_index(files)
        self.disk = DiskTier(files, cfg.disk_mb, self.index, self.kind, self.book, self.counts)
        self.ram = RamTier(cfg.ram_mb * MB, self.index, self.kind, below=self.disk)
        if self.readonly:
            log.warning("state store %s is read-only: restoring saved states, saving none", self.dir)
            return
        self.ram.drop_stale_rows()
        self.disk.drop_temp()  # saves that were interrupted

    @classmethod
    def open(cls, cfg: StoreConfig, model_path: str | Path, layout: bytes, layout_params: dict,
             whole_state_only: bool = False, shrink: ShrinkFn | None = None) -> "StateStore | None":
        """The store for the model at ``model_path`` (its fingerprint is cached in the store), or None
        with one warning when the directory or index cannot be used at all (a full disk, a path that is
        not a directory, a directory another user could change): efim then serves without saved states."""
        d = Path(cfg.dir)
        try:
            try:
                cache = private_dir(d)  # checked before the fingerprint cache is written into it
            except OSError:  # a read-only or full disk: the store's own checks say what to do
                cache = d if d.is_dir() and not d.is_symlink() else None
            fp = model_fingerprint(model_path, cache)
            return cls(cfg, fp, layout, layout_params, whole_state_only, shrink)
        except (StoreError, OSError) as e:
            log.warning("state store %s is unusable (%s): serving without saved states", cfg.dir, one_line(str(e)))
            return None

    @classmethod
    def admin(cls, cfg: StoreConfig) -> "StateStore":
        """A store opened without a model, for listing and maintenance."""
        return cls(cfg, model=b"", layout=b"", layout_params={})

    def _open_index(self, files: Path) -> Index:
        """The index; a corrupt or foreign one is set aside and rebuilt from the state files."""
        path = self.dir / "index.db"
        try:
            return Index(path, readonly=self.readonly)
        except IndexCorrupt as e:
            if self.readonly:
                raise
            log.warning("%s; rebuilding it from the state files", one_line(str(e)))
        for suffix in ("", "-wal", "-shm", "-journal"):
            stateformat.remove(path.with_name(path.name + suffix))
        index = Index(path)
        rebuild(files, index, max_file_bytes(self.cfg.disk_mb))
        return index

    def _try(self, what: str, fn, *args):
        """Run a store write. A full or read-only disk or a failing index costs the save, never the
        request: one warning per kind of failure, then None."""
        if self.readonly:
            return None
        try:
            return fn(*args)
        except (OSError, StoreError) as e:
            if isinstance(e, StateFileError):
                raise
            self._warn_once(what, e)
            return None

    def _warn_once(self, what: str, e: Exception) -> None:
        key = (what, getattr(e, "errno", None) or type(e).__name__)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("state store %s: %s failed (%s); serving on without it", self.dir, what, one_line(str(e)))

    def close(self) -> None:
        self.flush_counts()
        self.index.close()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- where states are -----------------------------------------------------------------
    def ram_bytes(self) -> int:
        return self.ram.used()

    def disk_bytes(self) -> int:
        return self.disk.used()

    @property
    def selected(self) -> dict:
        """State id -> times each position was selected by sparse restores."""
        return self.book.selected

    def file_of(self, state_id: str) -> Path:
        return self.disk.file_of(state_id)

    def _holder(self, state_id: str, tier: str = "disk") -> Tier | None:
        """The tier holding a state whose index row names ``tier`` (RAM first: it may be newer)."""
        if state_id in self.ram:
            return self.ram
        return self.disk if tier == "disk" else None

    def load_partial(self, state_id: str, max_bytes: int = 1 << 30) -> bytes | None:
        """The state's saved partial keys, or None (the caller computes them)."""
        if state_id in self.ram:
            return self.ram.partial(state_id)
        return self.disk.partial(state_id, max_bytes)

    def state_id(self, tokens: np.ndarray) -> str:
        h = hashlib.sha256(self.kind.model + self.kind.layout)
        h.update(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        return h.hexdigest()[:32]  # file names come from hashes, never from paths

    # -- lookup and load ------------------------------------------------------------------
    def lookup(self, tokens: np.ndarray, path: str | None = None, content_hash=None,
               shrunk: bool = False) -> Lookup:
        """The saved state sharing the longest usable token prefix with ``tokens``
        (shrunk, approximate states too when ``shrunk``). ``content_hash()`` gives the document's
        content hash, asked for only on a miss (to tell ``tokenization_differs``). A failing index is
        a miss, with one warning."""
        try:
            return self._lookup(tokens, path, content_hash, shrunk)
        except StoreError as e:
            self._warn_once("lookup", e)
            return Lookup(None, "no_state")

    def _lookup(self, tokens, path, content_hash, shrunk) -> Lookup:
        best: Match | None = None
        saw_corrupt = False
        for row, _ in self.index.candidates(tokens, self._model_hex, self._layout_hex, shrunk=shrunk):
            if row["id"] in self.bad:
                continue
            tier = self._holder(row["id"], row["tier"])
            if tier is None:  # a RAM row of another process (or a stale one): not ours, not corrupt
                self._try("index update", self.index.remove, row["id"])
                continue
            st = self._tokens_of(tier, row["id"])
            if st is None:
                saw_corrupt = True
                continue
            n = common_prefix(st, tokens)
            if (self.whole_state_only or row["kept"] < 1) and n < len(st):
                continue  # a sliding-window or shrunk state cannot be cut
            if best is None or n > best.n:
                best = Match(row["id"], n, row["tier"], st, row["kept"])
        if best is not None:
            return Lookup(best)
        return Lookup(None, "corrupt" if saw_corrupt else self._miss_reason(path, content_hash))

    def _miss_reason(self, path: str | None, content_hash) -> str:
        if path is None:
            return "no_state"
        rows = self.index.by_path(path)
        if any(r["model"] != self._model_hex for r in rows):
            return "model_changed"
        h = content_hash() if callable(content_hash) else content_hash
        if h and any(r["content_hash"] == h and r["model"] == self._model_hex for r in rows):
            return "tokenization_differs"
        if self.index.was_evicted(path, self._model_hex):
            return "evicted"
        return "no_state"

    def _tokens_of(self, tier: Tier, state_id: str) -> np.ndarray | None:
        """A state's tokens; None if its file is bad (then it is dropped, with a warning)."""
        try:
            return tier.tokens(state_id)
        except (StateFileError, OSError) as e:
            self._drop_bad(state_id, e)
            return None

    def load(self, match: Match, n_tokens: int) -> bytes | None:
        """The normalized state for ``match``, cut to ``n_tokens`` when allowed; None if unusable."""
        try:
            toks, payload = self._holder(match.id).read(match.id)
        except (StateFileError, OSError) as err:
            self._drop_bad(match.id, err)
            return None
        if not np.array_equal(toks, match.tokens):
            self._drop_bad(match.id, StateFileError("corrupt", "state changed under us"))
            return None
        self._try("index update", self.index.touch, match.id)
        if n_tokens < len(toks):
            if self.whole_state_only:
                return None
            payload = kvblob.truncate(payload, n_tokens)
        return payload

    def drop(self, state_id: str, reason: str = "corrupt") -> None:
        """Delete a state that turned out unusable (llama.cpp rejected it): never restore it again."""
        self._drop_bad(state_id, StateFileError(reason, "rejected on restore"))

    def _drop_bad(self, state_id: str, err: Exception) -> None:
        log.warning("dropping state %s: %s", state_id[:12], err)
        self.counts["dropped_" + getattr(err, "reason", "corrupt")] += 1
        self.ram.remove(state_id)
        self.bad.add(state_id)  # never tried again, even where it cannot be deleted (a read-only disk)
        self._try("drop", self.disk.remove, state_id)
        self._try("index update", self.index.remove, state_id)

    # -- saving ---------------------------------------------------------------------------
    def put(self, tokens: np.ndarray, payload: bytes, path: str, content_hash: str = "",
            partial: bytes | None = None, keep: str | None = None) -> str | None:
        """Add a state to the RAM tier (spilling others down); replaces older states of ``path`` but
        ``keep`` (one about to be restored). ``partial``: its InfiniGen partial keys, saved beside it.
        A full or read-only disk skips the save (one warning) and returns None."""
        if len(tokens) < self.cfg.min_tokens:
            return None
        return self._try("save", self._put, tokens, payload, path, content_hash, partial, keep)

    def _put(self, tokens, payload, path, content_hash, partial, keep=None) -> str:
        sid = self.state_id(tokens)
        row = self.index.get(sid)
        if row is not None and row["kept"] >= 1 and (sid in self.ram or self.file_of(sid).exists()):
            self.index.touch(sid)  # already saved: same model, layout and tokens
            return sid
        for row in self.index.by_path(path):
            if row["id"] not in (sid, keep) and row["model"] == self._model_hex:
                self._delete(row["id"])
        now = time.time()
        entry = Entry(sid, np.array(tokens, dtype=np.int32), payload, path, content_hash, now, now, partial=partial)
        if RamTier.size(entry) > self.ram.budget:
            self.disk.add(entry)  # too big for RAM: straight to disk
            return sid
        old = self.index.get(sid)
        if old:
            entry.hits, entry.created = old["hits"], old["created"]
        self._delete(sid, keep_index=True)
        self.ram.add(entry)
        return sid

    def spill(self) -> int:
        """Write every RAM state to disk (before the process exits). Returns how many were written
        (a full or read-only disk writes none, with one warning)."""
        return sum(self._try("save", lambda e: self.disk.add(e) or 1, e) or 0 for e in self.ram.drain())

    def note_selection(self, state_id: str, positions: np.ndarray) -> None:
        """Count which cells a sparse restore chose, per position (in memory: no disk write on the
        request path)."""
        self.book.note(state_id, positions)

    def _delete(self, state_id: str, keep_index: bool = False) -> None:
        self.ram.remove(state_id)
        self.disk.remove(state_id)
        if not keep_index:
            self.index.remove(state_id)

    # -- maintenance ----------------------------------------------------------------------
    def gc(self) -> dict:
        """Reconcile index and files in both directions, then enforce the budgets."""
        if self.readonly:
            raise StoreError(f"state store {self.dir} is read-only")
        rows = {r["id"]: r for r in self.index.rows()}
        files = self.disk.state_files()
        out = Counter()
        for sid, r in rows.items():
            if not valid_id(sid) or (r["tier"] == "disk" and sid not in files):
                self.index.remove(sid)
                out["rows_without_file"] += 1
        out["stale_ram_rows"] = self.ram.drop_stale_rows()
        out.update(self.disk.reconcile(rows, files))
        self.disk.make_room(0)
        self.ram.make_room(0)
        return {k: out[k] for k in ("rows_without_file", "files_without_row", "stale_ram_rows", "temp_files")}

    def clear(self) -> None:
        if self.readonly:
            raise StoreError(f"state store {self.dir} is read-only")
        self.ram.clear()
        self.disk.clear()
        self.index.clear()

    def record(self, event: Event) -> None:
        """Count a hit or miss event (in memory; written to the index when idle)."""
        for name in counter_names(event):
            self.counts[name] += 1

    def flush_counts(self) -> None:
        """Write the counts to the index (kept in memory while the disk refuses)."""
        counts = dict(self.counts)
        if counts and self._try("counter update", lambda: self.index.bump(counts) or True):
            self.counts.subtract(counts)  # in place: the disk tier counts into the same Counter
            for k in [k for k, v in self.counts.items() if v <= 0]:
                del self.counts[k]

    def stats(self) -> dict:
        self.flush_counts()
        try:
            rows, saved = self.index.rows(), self.index.counters()
        except StoreError as err:  # an index that fails now: report what is in memory (status must answer)
            self._warn_once("index read", err)
            rows, saved = [self.kind.row(e, "ram", len(e.payload)) for e in self.ram.entries.values()], {}
        tiers = {t: {"states": sum(r["tier"] == t for r in rows),
                     "bytes": sum(r["bytes"] for r in rows if r["tier"] == t)}
                 for t in ("ram", "disk")}
        tiers["ram"]["budget_bytes"] = int(self.cfg.ram_mb * MB)
        tiers["disk"]["budget_bytes"] = int(self.cfg.disk_mb * MB)
        c = Counter(saved) + self.counts  # with what a refusing disk kept in memory
        return {
            "dir": str(self.dir), "tiers": tiers,
            "hits": {t: c.get(f"hit_{t}", 0) for t in ("slot", "ram", "disk")},
            "misses": {r: c.get(f"miss_{r}", 0) for r in MISS_REASONS},
            "sparse_restores": c.get("sparse_restores", 0),
            "dropped": {k[len("dropped_"):]: v for k, v in c.items() if k.startswith("dropped_")},
            "evicted_disk": c.get("evicted_disk", 0),
            "shrunk_disk": c.get("shrunk_disk", 0),
        }
