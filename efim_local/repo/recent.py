"""T2, the volatile tier of repository context: where the user worked lately in *other* files of the
project, and the definitions their editor resolved (issue 25).

- Each request (once it ended) and each settled cursor records its file's block of ``BLOCK`` lines around the
  cursor (``Recent.visit``: after the answer or on the notification, never on the keystroke path).
- A file's T2 is the latest blocks of other files of its project whose text the daemon holds, oldest
  first (the latest nearest the file), within ``chars``.
- Its key is the blocks and the document versions they were visited at. Typing in a file never
  changes that file's own key: it changes only when the user works elsewhere. A changed key makes the
  file's lead stale; the rebuild runs in idle time (``RepoBuild.rebuild_steps``), and the old plan serves
  until the new one is prefilled.

Definitions an editor sends (``definitions``: where its language server's "go to definition" landed
for the names a file imports) are kept per file here too and join T1 (``repo.tiers.file_context``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..prompt.repo_format import Piece
from .tiers import Tier, make_tier

BLOCK = 32  # lines per block; a block starts at a multiple of BLOCK/2, the cursor in its second half
MAX_BLOCKS = 16  # blocks remembered per project
T2_BLOCKS = 4  # blocks in a file's T2, and blocks remembered per file (moving about in one file never
               # pushes the other files' blocks out)
MIN_LINES = 4  # a block cut to fit keeps at least this many lines, else it is left out
T2_CHARS = 1200
MAX_DEFINITIONS = 64  # locations kept per file
EMPTY_T2 = make_tier("t2", ())

BlockKey = tuple[tuple[str, int, int], ...]  # (path, first line, version) of each block


class Recent:
    """The recent blocks of one project's files, and the editor's definitions per file. Thread-safe."""

    def __init__(self, chars: int = T2_CHARS):
        self.chars = chars
        self.lock = threading.Lock()
        self.blocks: OrderedDict[tuple[str, int], int] = OrderedDict()  # (path, first line) -> version
        self.defs: dict[str, tuple[tuple[str, int], ...]] = {}

    def visit(self, path: str, text: str, offset: int, version: int) -> None:
        """The user worked at ``offset`` of ``path`` (document version ``version``)."""
        line = text.count("\n", 0, max(0, min(offset, len(text))))
        half = BLOCK // 2
        first = max(0, line - line % half - half)
        with self.lock:
            self.blocks[(path, first)] = version
            self.blocks.move_to_end((path, first))
            mine = [k for k in self.blocks if k[0] == path]
            for k in mine[:max(0, len(mine) - T2_BLOCKS)]:
                del self.blocks[k]
            while len(self.blocks) > MAX_BLOCKS:
                self.blocks.popitem(last=False)

    def forget(self, path: str) -> None:
        """``path`` was closed: its blocks leave T2 (their text is no longer the editor's)."""
        with self.lock:
            for k in [k for k in self.blocks if k[0] == path]:
                del self.blocks[k]

    def key(self, path: str) -> BlockKey:
        """The blocks ``path``'s T2 holds: the latest of other files, a block overlapping a later one
        of the same file left out; oldest first."""
        out: list[tuple[str, int, int]] = []
        with self.lock:
            items = list(self.blocks.items())
        for (p, first), version in reversed(items):
            if p == path or any(q == p and abs(f - first) < BLOCK for q, f, _ in out):
                continue
            out.append((p, first, version))
            if len(out) == T2_BLOCKS:
                break
        return tuple(reversed(out))

    def tier(self, key: BlockKey, text_of, rel_of) -> Tier:
        """T2 for the blocks ``key``: each block's current lines (``text_of(path)``: the open text, or
        None) under its relative path (``rel_of(path)``), the latest first to fit ``chars``; a block
        that does not fit is cut to its lines nearest the cursor (its second half first)."""
        pieces: list[Piece] = []
        used = 0
        for p, first, _ in reversed(key):
            text, rel = text_of(p), rel_of(p)
            if text is None or rel is None:
                continue
            lines = [line.rstrip() for line in text.split("\n", first + BLOCK)[first:first + BLOCK]]
            room = self.chars - used - len(rel) - 3
            top = 0
            while len(lines) - top > MIN_LINES and sum(len(x) + 1 for x in lines[top:]) > room:
                if top < BLOCK // 2:
                    top += 1
                else:  # the cursor's half is left: cut its end instead
                    lines.pop()
            body = "\n".join(lines[top:]).strip("\n")
            if not body.strip() or len(body) + 1 > room:
                continue
            pieces.append(Piece(rel, body + "\n"))
            used += len(rel) + len(body) + 4
        return make_tier("t2", reversed(pieces))

    # -- definitions an editor resolved --------------------------------------------------------
    def set_definitions(self, path: str, locations) -> bool:
        """The editor's definitions for ``path``: (file, line) pairs, deduplicated and sorted, at most
        ``MAX_DEFINITIONS``. True when they changed (the file's T1 is then stale)."""
        new = tuple(sorted(set(locations)))[:MAX_DEFINITIONS]
        with self.lock:
            changed = self.defs.get(path, ()) != new
            self.defs[path] = new
            if len(self.defs) > 1024:
                self.defs.pop(next(iter(self.defs)))
            return changed

    def definitions(self, path: str) -> tuple[tuple[str, int], ...]:
        with self.lock:
            return self.defs.get(path, ())
