"""The stable tiers of repository context, as pieces of text under real relative paths.

- T0 (per project): a map of the project, the public top-level definitions of its most imported files,
  one line each, like a stub file. It depends only on definitions' headers, so editing a body leaves
  it (and its digest) unchanged.
- T1 (per file): the definitions a file uses from other project files (its imports that it refers
  to, and the locations an editor's language server resolved for it: ``extra``), each as its header
  and first lines; a class also lists its methods' headers.

Both are deterministic (sorted by path, then line), bounded in characters, and content-addressed: the
digest is a hash of the pieces, so a tier can be saved, restored and compared across restarts.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from dataclasses import dataclass

from ..prompt.repo_format import Piece
from .index import RepoIndex, Target
from .parse import Definition, parse_file, uses


@dataclass(frozen=True)
class TierLimits:
    t0_chars: int = 2000
    t0_lines_per_file: int = 10
    t1_chars: int = 2500
    t1_first_lines: int = 4  # body lines after a header (a docstring, the first statements)
    t1_snippet_chars: int = 700
    t1_methods: int = 12  # method headers listed under a class
    line_chars: int = 160


@dataclass(frozen=True)
class Tier:
    name: str  # "t0" or "t1"
    pieces: tuple[Piece, ...]
    digest: str

    @property
    def chars(self) -> int:
        return sum(len(p.path) + len(p.text) for p in self.pieces)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "digest": self.digest, "pieces": [[p.path, p.text] for p in self.pieces]})

    @classmethod
    def from_json(cls, data: str) -> Tier:
        """Restore a saved tier; raises ValueError when the text does not match its digest."""
        obj = json.loads(data)
        tier = make_tier(obj["name"], [Piece(p, t) for p, t in obj["pieces"]])
        if tier.digest != obj["digest"]:
            raise ValueError("saved repository context does not match its digest")
        return tier


def make_tier(name: str, pieces) -> Tier:
    pieces = tuple(pieces)
    blob = json.dumps([name, [[p.path, p.text] for p in pieces]], ensure_ascii=False).encode()
    return Tier(name, pieces, hashlib.sha256(blob).hexdigest())


def _one_line(sig: str, limit: int, python: bool) -> str:
    line = " ".join(sig.split("\n")).replace("( ", "(").replace(", )", ")").replace(",)", ")")
    line = line if len(line) <= limit else line[:limit - 3] + "..."
    return line + " ..." if python and line.endswith(":") else line


def in_degree(index: RepoIndex) -> dict[str, int]:
    """How many other project files import each file."""
    deg: dict[str, int] = {}
    for rel, sym in index.files.items():
        for src in {index.resolve_module(rel, imp) for imp in sym.imports} - {None, rel}:
            deg[src] = deg.get(src, 0) + 1
    return deg


def project_map(index: RepoIndex, limits: TierLimits = TierLimits(), exclude: str | None = None) -> Tier:
    """T0: public top-level definitions, most imported files first, within ``limits.t0_chars``;
    pieces in path order. ``exclude``: leave one file out (evaluation: no leak of the file scored)."""
    deg = in_degree(index)
    chosen: list[Piece] = []
    used = 0
    for rel in sorted(index.files, key=lambda p: (-deg.get(p, 0), p)):
        sym = index.files[rel]
        if rel == exclude:
            continue
        py = rel.endswith((".py", ".pyi"))
        lines = [_one_line(d.signature, limits.line_chars, py) for d in sym.definitions
                 if d.parent is None and not d.name.startswith("_") and (d.kind != "variable" or d.name.isupper())]
        if not lines:
            continue
        text = "\n".join(lines[:limits.t0_lines_per_file]) + "\n"
        cost = len(rel) + len(text) + 2
        if used + cost > limits.t0_chars:
            continue
        chosen.append(Piece(rel, text))
        used += cost
    return make_tier("t0", sorted(chosen, key=lambda p: p.path))


class _Lines:
    """Source lines of project files, read once per content digest."""

    def __init__(self, index: RepoIndex):
        self.index, self.cache = index, {}

    def get(self, rel: str) -> list[str]:
        key = (rel, index_digest(self.index, rel))
        if key not in self.cache:
            try:
                self.cache[key] = (self.index.root / rel).read_text("utf-8", errors="replace").splitlines()
            except OSError:
                self.cache[key] = []
        return self.cache[key]


def index_digest(index: RepoIndex, rel: str) -> str:
    sym = index.files.get(rel)
    return sym.digest if sym else ""


def snippet(index: RepoIndex, lines: list[str], rel: str, d: Definition, limits: TierLimits) -> str:
    """A definition's header and first lines; a class's method headers follow its first lines."""
    head_end = d.line + d.sig_lines
    if d.kind == "variable":
        body = lines[d.line:min(d.end_line + 1, d.line + 3)]
    else:
        end = min(d.end_line + 1, head_end + limits.t1_first_lines)
        methods = [m for m in index.files[rel].definitions if m.parent == d.name and m.line > d.line]
        if d.kind == "class" and methods:
            end = min(end, methods[0].line)  # the class's own first lines, then its methods' headers
        body = lines[d.line:end]
        while len(body) > 1 and not body[-1].strip():
            body.pop()
    more = d.end_line + 1 > d.line + len(body)
    text = textwrap.dedent("\n".join(body))
    if d.kind == "class":
        heads = [textwrap.indent(_one_line(m.signature, limits.line_chars, rel.endswith((".py", ".pyi"))), "    ")
                 for m in methods[:limits.t1_methods]]
        text += "\n" + "\n".join(heads) if heads else ""
    elif more:
        indent = len(lines[head_end]) - len(lines[head_end].lstrip()) if head_end < len(lines) else 4
        text += "\n" + " " * max(indent - (len(lines[d.line]) - len(lines[d.line].lstrip())), 0) + "..."
    if len(text) > limits.t1_snippet_chars:
        text = text[:limits.t1_snippet_chars].rsplit("\n", 1)[0] + "\n..."
    return text


def used_targets(index: RepoIndex, rel: str, source: bytes) -> dict[Target, int]:
    """Definitions of other project files that ``source`` (the file ``rel``, as the editor has it)
    imports and refers to, with how often it refers to them."""
    sym = parse_file(rel, source)
    u = uses(rel, source)
    out: dict[Target, int] = {}
    for local, t in index.bindings(rel, sym.imports).items():
        if t.definition is not None:
            if u.names.get(local, 0):
                out[t] = out.get(t, 0) + u.names[local]
            continue
        for (obj, attr), n in sorted(u.pairs.items()):
            if obj == local:
                tt = index.lookup(t.path, attr)
                if tt is not None and tt.definition is not None and tt.path != rel:
                    out[tt] = out.get(tt, 0) + n
    return out


def located(index: RepoIndex, rel: str, line: int) -> Target | None:
    """The innermost definition of project file ``rel`` that spans ``line`` (0-based): where an
    editor's "go to definition" landed. None when the file is not in the index or no definition
    spans the line."""
    sym = index.files.get(rel)
    spans = [d for d in sym.definitions if d.line <= line <= d.end_line] if sym is not None else []
    return Target(rel, max(spans, key=lambda d: d.line)) if spans else None


def file_context(index: RepoIndex, rel: str, source: bytes | str, limits: TierLimits = TierLimits(),
                 extra: tuple[tuple[str, int], ...] = ()) -> Tier:
    """T1 for file ``rel`` with content ``source``: the most used imported definitions that fit
    ``limits.t1_chars``, grouped by file in path order, definitions in line order. ``extra``:
    (file, line) locations of definitions the editor resolved (LSP), each counted as one use."""
    if isinstance(source, str):
        source = source.encode("utf-8", "surrogateescape")
    lines = _Lines(index)
    counts = used_targets(index, rel, source)
    for path, line in extra:
        t = located(index, path, line) if path != rel else None
        if t is not None:
            counts[t] = counts.get(t, 0) + 1
    ranked = sorted(counts.items(),
                    key=lambda kv: (-kv[1], kv[0].path, kv[0].definition.line))
    picked: list[tuple[str, int, str]] = []
    used = 0
    for t, _ in ranked:
        text = snippet(index, lines.get(t.path), t.path, t.definition, limits)
        if used + len(text) + len(t.path) + 2 > limits.t1_chars:
            continue
        picked.append((t.path, t.definition.line, text))
        used += len(text) + len(t.path) + 2
    by_path: dict[str, list[tuple[int, str]]] = {}
    for path, line, text in picked:
        by_path.setdefault(path, []).append((line, text))
    pieces = [Piece(p, "\n".join(t for _, t in sorted(by_path[p])) + "\n") for p in sorted(by_path)]
    return make_tier("t1", pieces)


def cross_file_names(index: RepoIndex, rel: str, source: bytes) -> dict[str, Target]:
    """Local names of ``source`` bound to definitions or modules of other project files."""
    return index.bindings(rel, parse_file(rel, source).imports)
