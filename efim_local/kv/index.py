"""The SQLite index of saved states (sqlite-utils, WAL mode, versioned migrations).

Candidates for a prompt are found through indexed hashes of its token-prefix
chunks (every ``CHUNK`` tokens), never by scanning every state.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
import stat
import time
from pathlib import Path

import numpy as np
import sqlite_utils

from .private import private_file
from ..errors import StoreError

CHUNK = 64
SCHEMA_VERSION = 4
_ID = re.compile(r"[0-9a-f]{32}")
# SQLite result codes that mean the file is not (or no longer) an index we can use as it is.
_CORRUPT = {"SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_ERROR", "SQLITE_MISMATCH", "SQLITE_CONSTRAINT"}


def valid_id(state_id) -> bool:
    """A state id is 32 lowercase hex digits (a hash): checked before any path is built from one."""
    return isinstance(state_id, str) and _ID.fullmatch(state_id) is not None


class IndexCorrupt(StoreError):
    """The index file is not a database, is damaged, or has a newer or foreign schema: rebuild it."""


def _errors(fn):
    """SQLite failures as StoreError (one line for users; the store decides what to do)."""

    @functools.wraps(fn)
    def wrapper(self, *a, **kw):
        try:
            return fn(self, *a, **kw)
        except sqlite3.Error as e:
            raise StoreError(f"state index {self.path}: {e}") from None

    return wrapper


def chunk_hashes(tokens: np.ndarray) -> list[tuple[str, int]]:
    """(hash, length) of every prefix of ``tokens`` whose length is a multiple of CHUNK."""
    data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    h = hashlib.blake2b(digest_size=12)
    out = []
    for n in range(CHUNK, len(tokens) + 1, CHUNK):  # one digest per 64 tokens
        h.update(data[(n - CHUNK) * 4:n * 4])
        out.append((h.copy().hexdigest(), n))
    return out


def _v1(db: sqlite_utils.Database) -> None:
    db["states"].create({
        "id": str, "path": str, "content_hash": str, "model": str, "layout": str, "n_tokens": int,
        "bytes": int, "tier": str, "created": float, "last_used": float, "hits": int,
    }, pk="id", if_not_exists=True)
    db["chunks"].create({"hash": str, "state_id": str, "n": int}, if_not_exists=True)
    db["chunks"].create_index(["hash"], if_not_exists=True)
    db["chunks"].create_index(["state_id"], if_not_exists=True)
    db["states"].create_index(["model", "layout"], if_not_exists=True)
    db["states"].create_index(["path"], if_not_exists=True)


def _v2(db: sqlite_utils.Database) -> None:
    # Counters for `efim cache stats`, and a memory of evictions for miss reasons.
    db["counters"].create({"name": str, "value": int}, pk="name", if_not_exists=True)
    db["evicted"].create({"path": str, "model": str, "time": float}, pk=("path", "model"), if_not_exists=True)


def _v3(db: sqlite_utils.Database) -> None:
    # RAM-tier rows name the process holding them, so other processes leave live ones alone.
    db["states"].add_column("owner", int, not_null_default=0)


def _v4(db: sqlite_utils.Database) -> None:
    # Under disk pressure a long state may be shrunk to its most-selected cells (InfiniGen's pool):
    # ``kept`` < 1 marks such approximate states, which only sparse restores may use.
    db["states"].add_column("kept", float, not_null_default=1.0)


MIGRATIONS = [_v1, _v2, _v3, _v4]  # index i migrates the schema to version i + 1
assert len(MIGRATIONS) == SCHEMA_VERSION


# The columns this version reads; an index without them is foreign (another program's or damaged).
COLUMNS = {"states": {"id", "path", "content_hash", "model", "layout", "n_tokens", "bytes", "tier", "created",
                      "last_used", "hits", "owner", "kept"},
           "chunks": {"hash", "state_id", "n"}, "counters": {"name", "value"}, "evicted": {"path", "model", "time"}}


def _private_files(path: Path) -> None:
    """The index 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database
    file's mode (older versions left all three 0644 under the usual umask)."""
    try:
        private_file(path)
        for suffix in ("-wal", "-shm"):
            private_file(path.with_name(path.name + suffix), create=False)
    except OSError as e:
        raise StoreError(f"state index {path}: {e.strerror or e}") from None


class Index:
    """The index at ``path``. Raises IndexCorrupt if it must be rebuilt, StoreError if it cannot be
    used (a full disk, an unreadable directory). ``readonly``: opened immutable, never written."""

    def __init__(self, path: Path, readonly: bool = False):
        self.path, self.readonly = path, readonly
        if not readonly:
            _private_files(path)
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if readonly and st is None:
            raise StoreError(f"state index {path} does not exist (read-only store)")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise IndexCorrupt(f"state index {path} is not a regular file")
        try:
            # One thread at a time uses it (the engine thread), but not always the one that opened it.
            if readonly:
                conn = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True, check_same_thread=False)
            else:
                conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10)
        except sqlite3.Error as e:
            raise StoreError(f"state index {path}: {e}") from None
        self.db = sqlite_utils.Database(conn)
        try:
            if not readonly:
                self.db.enable_wal()
            self.migrate()
            self.check_schema()
        except sqlite3.Error as e:
            conn.close()
            cls = IndexCorrupt if getattr(e, "sqlite_errorname", None) in _CORRUPT else StoreError
            raise cls(f"state index {path}: {e}") from None
        except StoreError:
            conn.close()
            raise

    def close(self) -> None:
        self.db.close()

    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        v = self.version()
        if v > SCHEMA_VERSION:
            raise IndexCorrupt(f"state index schema {v} is newer than this efim ({SCHEMA_VERSION})")
        if self.readonly and v != SCHEMA_VERSION:
            raise StoreError(f"state index schema {v} needs a migration, but the store is read-only")
        for i in range(v, SCHEMA_VERSION):
            with self.db.conn:
                MIGRATIONS[i](self.db)
                self.db.execute(f"PRAGMA user_version = {i + 1}")

    def check_schema(self) -> None:
        """Raise IndexCorrupt unless every table has the columns this version uses."""
        for table, cols in COLUMNS.items():
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})").fetchall()}
            if not cols <= have:
                raise IndexCorrupt(f"state index {self.path}: table {table} has a foreign schema")

    # -- states -------------------------------------------------------------
    @_errors
    def add(self, row: dict, tokens: np.ndarray) -> None:
        with self.db.conn:
            self.db["states"].upsert(row, pk="id")
            self.db.execute("DELETE FROM chunks WHERE state_id = ?", [row["id"]])
            self.db["chunks"].insert_all(({"hash": h, "state_id": row["id"], "n": n} for h, n in chunk_hashes(tokens)),
                                         batch_size=1000)
            self.db.execute("DELETE FROM evicted WHERE path = ? AND model = ?", [row["path"], row["model"]])

    @_errors
    def remove(self, state_id: str, evicted: bool = False) -> None:
        with self.db.conn:
            if evicted:
                row = self.get(state_id)
                if row:
                    self.db["evicted"].upsert({"path": row["path"], "model": row["model"], "time": time.time()},
                                              pk=("path", "model"))
            self.db.execute("DELETE FROM chunks WHERE state_id = ?", [state_id])
            self.db.execute("DELETE FROM states WHERE id = ?", [state_id])

    @_errors
    def get(self, state_id: str) -> dict | None:
        rows = list(self.db.query("SELECT * FROM states WHERE id = ?", [state_id]))
        return rows[0] if rows else None

    @_errors
    def rows(self, tier: str | None = None) -> list[dict]:
        if tier:
            return list(self.db.query("SELECT * FROM states WHERE tier = ? ORDER BY last_used", [tier]))
        return list(self.db.query("SELECT * FROM states ORDER BY last_used"))

    @_errors
    def set_tier(self, state_id: str, tier: str) -> None:
        self.db.execute("UPDATE states SET tier = ? WHERE id = ?", [tier, state_id])
        self.db.conn.commit()

    @_errors
    def touch(self, state_id: str) -> None:
        self.db.execute("UPDATE states SET last_used = ?, hits = hits + 1 WHERE id = ?", [time.time(), state_id])
        self.db.conn.commit()

    @_errors
    def candidates(self, tokens: np.ndarray, model: str, layout: str, limit: int = 4,
                   shrunk: bool = False) -> list[tuple[dict, int]]:
        """States of this model whose chunk hashes match a prefix of ``tokens``, longest first;
        shrunk (approximate) states only when ``shrunk``."""
        hashes = chunk_hashes(tokens)
        if not hashes:
            return []
        marks = ",".join("?" * len(hashes))
        sql = f"""SELECT s.*, MAX(c.n) AS matched FROM chunks c JOIN states s ON s.id = c.state_id
                  WHERE c.hash IN ({marks}) AND s.model = ? AND s.layout = ? AND (s.kept >= 1 OR ?)
                  GROUP BY s.id ORDER BY matched DESC, s.last_used DESC LIMIT ?"""
        rows = self.db.query(sql, [h for h, _ in hashes] + [model, layout, int(shrunk), limit])
        return [(r, r.pop("matched")) for r in rows]

    @_errors
    def by_path(self, path: str) -> list[dict]:
        return list(self.db.query("SELECT * FROM states WHERE path = ?", [path]))

    @_errors
    def was_evicted(self, path: str, model: str) -> bool:
        return bool(list(self.db.query("SELECT 1 FROM evicted WHERE path = ? AND model = ?", [path, model])))

    # -- counters -------------------------------------------------------------
    @_errors
    def bump(self, counts: dict[str, int]) -> None:
        if not counts:
            return
        with self.db.conn:
            for name, n in counts.items():
                self.db.execute("INSERT INTO counters(name, value) VALUES(?, ?) "
                                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value", [name, n])

    @_errors
    def counters(self) -> dict[str, int]:
        return {r["name"]: r["value"] for r in self.db.query("SELECT * FROM counters ORDER BY name")}

    @_errors
    def clear(self) -> None:
        with self.db.conn:
            for t in ("states", "chunks", "evicted", "counters"):
                self.db.execute(f"DELETE FROM {t}")
