"""StateStore: saved KV states in host RAM and on disk, under MB budgets.

Tiers: live slots (the engine's) → RAM (normalized ``llama_state_seq_get_data``
bytes) → disk (state files) → deleted. Eviction moves a state one tier down,
least valuable first (recency, hits, length). Budgets hold at all times: a
state enters a tier only after room was made for it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .events import MISS_REASONS, Event, counter_names
from .prefix import common_prefix
from . import kvblob, stateformat
from .fingerprint import model_fingerprint
from .index import Index, IndexCorrupt, valid_id
from .tiers import MB, Tiers
from ..errors import StateFileError, StoreError, one_line

log = logging.getLogger("efim.store")


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
class Entry:
    """A state in the RAM tier."""

    id: str
    tokens: np.ndarray
    payload: bytes  # normalized sequence state
    path: str
    content_hash: str
    created: float
    last_used: float
    hits: int = 0
    partial: bytes | None = None  # InfiniGen partial keys (npz), kept beside the state


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


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _private_dir(d: Path) -> None:
    """Create ``d`` owner-only; chmod it only when its mode is wrong (a read-only disk is the caller's
    to handle: the OSError propagates)."""
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise StoreError(f"{d} is not a directory") from None
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{d} is not a directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)


_READONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _tmp_owner(p: Path) -> int:
    """The pid in a temp file name ``<id>.kv.<pid>.tmp``."""
    try:
        return int(p.name.rsplit(".", 2)[-2])
    except (ValueError, IndexError):
        return 0


@dataclass
class StateStore(Tiers):
    cfg: StoreConfig
    model: bytes  # model fingerprint
    layout: bytes  # layout key
    layout_params: dict
    whole_state_only: bool = False  # sliding-window models: restore whole states, never truncate
    ram: dict[str, Entry] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    shrink: object = None  # callable(payload, partial, selected) -> (payload, partial) | None
    selected: dict = field(default_factory=dict)  # state id -> times selected, indexed by position

    def __post_init__(self):
        self.dir = Path(self.cfg.dir)
        self.files = self.dir / "states"
        self.readonly = False  # a read-only disk: restore what is saved, save nothing
        self.bad: set[str] = set()  # states found unusable that could not be deleted (read-only)
        self._warned: set = set()
        try:
            for d in (self.dir, self.files):
                _private_dir(d)
        except OSError as e:
            if e.errno not in _READONLY or not self.files.is_dir():
                raise StoreError(f"state store {self.dir}: {e.strerror or e}") from None
            self.readonly = True
        self.readonly = self.readonly or not os.access(self.files, os.W_OK)
        self.index = self._open_index()
        self._model_hex, self._layout_hex = self.model.hex(), self.layout.hex()
        if self.readonly:
            log.warning("state store %s is read-only: restoring saved states, saving none", self.dir)
            return
        self._drop_stale_ram_rows()
        for tmp in self.files.glob("*.tmp"):
            if not _alive(_tmp_owner(tmp)):
                stateformat.remove(tmp)  # a save that was interrupted

    @classmethod
    def open(cls, cfg: StoreConfig, model_path: str | Path, *args, **kw) -> "StateStore | None":
        """The store for the model at ``model_path`` (its fingerprint is cached in the store), or None
        with one warning when the directory or index cannot be used at all (a full disk, a path that is
        not a directory): efim then serves without saved states."""
        try:
            try:
                Path(cfg.dir).mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError:
                pass  # a read-only or odd directory: the store's own checks say what to do
            fp = model_fingerprint(model_path, Path(cfg.dir) if Path(cfg.dir).is_dir() else None)
            return cls(cfg, fp, *args, **kw)
        except (StoreError, OSError) as e:
            log.warning("state store %s is unusable (%s): serving without saved states", cfg.dir, one_line(str(e)))
            return None

    def _open_index(self) -> Index:
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
        self._rebuild(index)
        return index

    def _rebuild(self, index: Index) -> int:
        """Add a row for every readable state file (any model: the header names it); drop the rest.
        Paths and hit counts are not in the files, so they start empty."""
        n = 0
        for p in self.files.glob("*.kv"):
            sid = p.name[:-3]
            try:
                if not valid_id(sid):
                    raise StateFileError("corrupt", "not a state file name")
                head, toks = stateformat.read_tokens(p, max_bytes=self._max_file_bytes())
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

    def _max_file_bytes(self) -> int:
        """No state file is larger than the disk budget (a bigger one was never written by us)."""
        return int(self.cfg.disk_mb * MB) + (64 << 20)

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

    def _drop_stale_ram_rows(self) -> int:
        """Forget RAM-tier rows of processes that are gone (or of this one, but not in RAM)."""
        n = 0
        for row in self.index.rows("ram"):
            mine = row["owner"] == os.getpid()
            if (mine and row["id"] not in self.ram) or (not mine and not _alive(row["owner"])):
                self.index.remove(row["id"])
                n += 1
        return n

    # -- sizes --------------------------------------------------------------
    def ram_bytes(self) -> int:
        return sum(len(e.payload) + e.tokens.nbytes for e in self.ram.values())

    def disk_bytes(self) -> int:
        return sum(r["bytes"] for r in self.index.rows("disk"))

    def partial_of(self, state_id: str) -> Path:
        """The partial-keys sidecar beside a state file (InfiniGen)."""
        return self.file_of(state_id).with_suffix(".pk")

    def _unlink(self, state_id: str) -> None:
        if valid_id(state_id):  # an id that is not a hash names no file of ours (`../../victim`)
            stateformat.remove(self.file_of(state_id))
            stateformat.remove(self.partial_of(state_id))

    def load_partial(self, state_id: str, max_bytes: int = 1 << 30) -> bytes | None:
        """The state's saved partial keys, or None (the caller computes them)."""
        e = self.ram.get(state_id)
        if e is not None:
            return e.partial
        try:
            with stateformat.open_regular(self.partial_of(state_id), max_bytes) as f:
                return f.read(max_bytes + 1)
        except (StateFileError, OSError):
            return None

    def file_of(self, state_id: str) -> Path:
        if not valid_id(state_id):
            raise StateFileError("corrupt", f"invalid state id {state_id[:40]!r}")
        return self.files / f"{state_id}.kv"

    def state_id(self, tokens: np.ndarray) -> str:
        h = hashlib.sha256(self.model + self.layout)
        h.update(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        return h.hexdigest()[:32]  # file names come from hashes, never from paths

    # -- lookup and load ------------------------------------------------------
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
            st = self._tokens_of(row)
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

    def _tokens_of(self, row: dict) -> np.ndarray | None:
        e = self.ram.get(row["id"])
        if e is not None:
            return e.tokens
        if row["tier"] != "disk":
            self._try("index update", self.index.remove, row["id"])
            return None
        try:
            _, toks = stateformat.read_tokens(self.file_of(row["id"]), self.model, self.layout,
                                              self._max_file_bytes())
            return toks
        except (StateFileError, OSError) as e:
            self._drop_bad(row["id"], e)
            return None

    def load(self, match: Match, n_tokens: int) -> bytes | None:
        """The normalized state for ``match``, cut to ``n_tokens`` when allowed; None if unusable."""
        e = self.ram.get(match.id)
        if e is not None:
            payload, toks = e.payload, e.tokens
            e.last_used, e.hits = time.time(), e.hits + 1
        else:
            try:
                _, toks, payload = stateformat.read(self.file_of(match.id), self.model, self.layout,
                                                    self._max_file_bytes())
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
        self.ram.pop(state_id, None)
        self.bad.add(state_id)  # never tried again, even where it cannot be deleted (a read-only disk)
        self._try("drop", self._unlink, state_id)
        self._try("index update", self.index.remove, state_id)

    # -- saving ---------------------------------------------------------------
    def put(self, tokens: np.ndarray, payload: bytes, path: str, content_hash: str = "",
            partial: bytes | None = None) -> str | None:
        """Add a state to the RAM tier (spilling others down); replaces older states of ``path``.
        ``partial``: its InfiniGen partial keys, saved beside it. A full or read-only disk skips the
        save (one warning) and returns None."""
        if len(tokens) < self.cfg.min_tokens:
            return None
        return self._try("save", self._put, tokens, payload, path, content_hash, partial)

    def _put(self, tokens, payload, path, content_hash, partial) -> str:
        sid = self.state_id(tokens)
        row = self.index.get(sid)
        if row is not None and row["kept"] >= 1 and (sid in self.ram or self.file_of(sid).exists()):
            self.index.touch(sid)  # already saved: same model, layout and tokens
            return sid
        for row in self.index.by_path(path):
            if row["id"] != sid and row["model"] == self._model_hex:
                self._delete(row["id"])
        now = time.time()
        entry = Entry(sid, np.array(tokens, dtype=np.int32), payload, path, content_hash, now, now, partial=partial)
        size = len(payload) + entry.tokens.nbytes
        if size > self.cfg.ram_mb * MB:
            self._write_disk(entry)  # too big for RAM: straight to disk
            return sid
        old = self.index.get(sid)
        if old:
            entry.hits, entry.created = old["hits"], old["created"]
        self._delete(sid, keep_index=True)
        self._make_room_ram(size)
        self.ram[sid] = entry
        self.index.add(self._row(entry, "ram", size), entry.tokens)
        return sid

    def note_selection(self, state_id: str, positions: np.ndarray) -> None:
        """Count which cells a sparse restore chose, per position (in memory: no disk write on the
        request path)."""
        if len(positions) == 0:
            return
        c = self.selected.get(state_id, np.zeros(0, np.int32))
        top = int(positions.max()) + 1
        if len(c) < top:
            c = self.selected[state_id] = np.concatenate([c, np.zeros(top - len(c), np.int32)])
        c[positions] += 1

    def _row(self, e: Entry, tier: str, size: int) -> dict:
        return {"id": e.id, "path": e.path, "content_hash": e.content_hash, "model": self._model_hex,
                "layout": self._layout_hex, "n_tokens": len(e.tokens), "bytes": size, "tier": tier,
                "created": e.created, "last_used": e.last_used, "hits": e.hits,
                "owner": os.getpid() if tier == "ram" else 0, "kept": 1.0}

    def _delete(self, state_id: str, keep_index: bool = False) -> None:
        self.ram.pop(state_id, None)
        self._unlink(state_id)
        if not keep_index:
            self.index.remove(state_id)

    # -- maintenance ----------------------------------------------------------
    def gc(self) -> dict:
        """Reconcile index and files in both directions, then enforce the budgets."""
        if self.readonly:
            raise StoreError(f"state store {self.dir} is read-only")
        rows = {r["id"]: r for r in self.index.rows()}
        # Only regular files are state files: a directory, FIFO or symlink under such a name is removed.
        regular = lambda p: stat.S_ISREG(p.lstat().st_mode)
        files = {p.stem: p for p in self.files.glob("*.kv") if regular(p)}
        out = Counter()
        for sid, r in rows.items():
            if not valid_id(sid) or (r["tier"] == "disk" and sid not in files):
                self.index.remove(sid)
                out["rows_without_file"] += 1
        out["stale_ram_rows"] = self._drop_stale_ram_rows()
        for p in self.files.glob("*.kv"):
            r = rows.get(p.stem)
            if r is None or r["tier"] != "disk" or not regular(p):
                stateformat.remove(p)
                out["files_without_row"] += 1
        for p in self.files.glob("*.pk"):
            if p.stem not in files or p.stem not in rows or not regular(p):
                stateformat.remove(p)
                out["files_without_row"] += 1
        for p in self.files.glob("*.tmp"):
            if not _alive(_tmp_owner(p)):
                stateformat.remove(p)
                out["temp_files"] += 1
        self._make_room_disk(0)
        self._make_room_ram(0)
        return {k: out[k] for k in ("rows_without_file", "files_without_row", "stale_ram_rows", "temp_files")}

    def clear(self) -> None:
        if self.readonly:
            raise StoreError(f"state store {self.dir} is read-only")
        self.ram.clear()
        for p in self.files.iterdir():
            stateformat.remove(p)
        self.index.clear()

    @classmethod
    def admin(cls, cfg: StoreConfig) -> "StateStore":
        """A store opened without a model, for listing and maintenance."""
        return cls(cfg, model=b"", layout=b"", layout_params={})

    def record(self, event: Event) -> None:
        """Count a hit or miss event (in memory; written to the index when idle)."""
        for name in counter_names(event):
            self.counts[name] += 1

    def flush_counts(self) -> None:
        """Write the counts to the index (kept in memory while the disk refuses)."""
        counts = dict(self.counts)
        if counts and self._try("counter update", lambda: self.index.bump(counts) or True):
            self.counts.subtract(counts)
            self.counts = +self.counts

    def stats(self) -> dict:
        self.flush_counts()
        try:
            rows, saved = self.index.rows(), self.index.counters()
        except StoreError as err:  # an index that fails now: report what is in memory (status must answer)
            self._warn_once("index read", err)
            rows, saved = [self._row(e, "ram", len(e.payload)) for e in self.ram.values()], {}
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
