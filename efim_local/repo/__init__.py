"""Repository context: the stable tiers of other-file context put before the current file (and
T2, the volatile tier of where the user worked lately in other files: ``recent.py``), and a file's
lead made of them, with the projects of the files served (``leads.py``).

Layer: above prompt (it renders with prompt.repo_format), below engine; no llama.cpp here.

    ctx = RepoContext("/path/to/project")          # discovers and parses (bounded; see Limits)
    t0 = ctx.t0()                                  # Tier: the project map, shared by every file
    t1 = ctx.t1("pkg/mod.py", buffer_text)         # Tier: what this file uses from other files
    segs = ctx.segments(fmt, "pkg/mod.py", t1)     # [(text, is_marker)] before the file's prefix
    ctx.saved("pkg/other.py", new_bytes)           # a save elsewhere: True if tiers may change
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from ..prompt.repo_format import RepoFormat, Segment, render
from .discover import Discovery, Limits, discover
from .index import RepoIndex, Target
from .parse import FileSymbols, parse_file
from .tiers import Tier, TierLimits, cross_file_names, file_context, make_tier, project_map

__all__ = ["Discovery", "FileSymbols", "Limits", "RepoContext", "RepoIndex", "Target", "Tier", "TierLimits",
           "TierStore", "cross_file_names", "discover", "file_context", "make_tier", "parse_file", "project_map"]


class RepoContext:
    """One project's index and tiers, with caches keyed by content. Thread-safe; every method is
    bounded by the discovery limits and the tier limits."""

    def __init__(self, root: str | os.PathLike, name: str | None = None, limits: Limits | None = None,
                 tier_limits: TierLimits | None = None):
        self.index = RepoIndex.build(root, name, limits)
        self.tier_limits = tier_limits or TierLimits()
        self._lock = threading.Lock()
        self._t0: Tier | None = None
        self._t1: dict[tuple, Tier] = {}

    @property
    def name(self) -> str:
        return self.index.name

    def relpath(self, path: str | os.PathLike) -> str | None:
        """``path`` relative to the root (posix), or None when it is outside the project."""
        try:
            rel = Path(os.path.realpath(path)).relative_to(os.path.realpath(self.index.root))
        except ValueError:
            return None
        return rel.as_posix()

    def t0(self) -> Tier:
        """The project map (cached until a save changes a definition)."""
        with self._lock:
            if self._t0 is None:
                self._t0 = project_map(self.index, self.tier_limits)
            return self._t0

    def t1(self, rel: str, source: bytes | str, extra: tuple[tuple[str, int], ...] = ()) -> Tier:
        """Definitions file ``rel`` (content ``source``, the editor's buffer) uses from other files;
        ``extra``: (file, line) of definitions the editor's language server resolved for it."""
        data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
        key = (rel, hashlib.sha256(data).hexdigest(), extra)
        with self._lock:
            tier = self._t1.get(key)
            if tier is None:
                tier = file_context(self.index, rel, data, self.tier_limits, extra)
                if len(self._t1) > 256:
                    self._t1.clear()
                self._t1[key] = tier
            return tier

    def saved(self, rel: str, source: bytes | None) -> bool:
        """A file was saved (None: deleted). True when T0 or some T1 may have changed (their caches
        are dropped; the digests tell whether the text really changed)."""
        with self._lock:
            changed = self.index.update(rel, source)
            if changed:
                self._t0 = None
                self._t1.clear()
            return changed

    def segments(self, fmt: RepoFormat, rel: str, t1: Tier | None = None, t0: Tier | None = None) -> list[Segment]:
        """The context before file ``rel``'s prefix in format ``fmt``: repo name, T0, T1, the file header."""
        t0 = t0 if t0 is not None else self.t0()
        return render(fmt, self.name, [t0.pieces, t1.pieces if t1 is not None else ()], rel)


class TierStore:
    """Tiers saved by digest (``<dir>/<digest>.json``), and the latest digest per key (a project root)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)

    def put(self, tier: Tier, key: str | None = None) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{tier.digest}.json"
        if not path.exists():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(tier.to_json(), "utf-8")
            os.replace(tmp, path)
        if key is not None:
            latest = self.dir / "latest.json"
            data = self._latest()
            data[key] = tier.digest
            tmp = latest.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, sort_keys=True), "utf-8")
            os.replace(tmp, latest)
        return path

    def get(self, digest: str) -> Tier | None:
        """The saved tier, or None if absent or damaged."""
        if not all(c in "0123456789abcdef" for c in digest) or len(digest) != 64:
            return None
        try:
            return Tier.from_json((self.dir / f"{digest}.json").read_text("utf-8"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def latest(self, key: str) -> Tier | None:
        digest = self._latest().get(key)
        return self.get(digest) if isinstance(digest, str) else None

    def _latest(self) -> dict:
        try:
            data = json.loads((self.dir / "latest.json").read_text("utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}
