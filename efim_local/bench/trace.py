"""Edit traces: real commits replayed as typing, with a completion request at word boundaries.

A trace holds (before, after) texts of one file for real commits. Replaying one deletes each
changed block of lines as a single edit (a selection deleted) and types the new lines character
by character; an editor's debounce fires when typing pauses, which we model as the moment a word
is complete. Each such moment is a :class:`Request`: the document and the cursor offset.
"""

from __future__ import annotations

import difflib
import gzip
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_TRACE = DATA / "edit-trace.json.gz"
# Shipped traces by name (`efim bench --trace NAME`): this project's own history, and pallets/click's
# releases 8.1.0 to 8.1.8 (BSD-3-Clause, the notice in data/click-trace.LICENSE.txt).
TRACES = {"efim": DEFAULT_TRACE, "click": DATA / "click-trace.json.gz"}


def resolve(name: str | Path | None) -> Path:
    """A shipped trace's path by name, or a trace file's path; None: the default trace."""
    if name is None:
        return DEFAULT_TRACE
    if str(name) in TRACES:
        return TRACES[str(name)]
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"no trace {str(name)!r}: use {' or '.join(TRACES)}, or a trace file's path")
    return path


@dataclass(frozen=True)
class Commit:
    """One real commit's change to one file."""

    file: str
    sha: str
    subject: str
    before: str
    after: str


@dataclass(frozen=True)
class Request:
    """A completion request during the replay: the whole document and the cursor offset."""

    text: str
    offset: int


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def requests(commit: Commit) -> Iterator[Request]:
    """Requests while typing ``commit`` on top of its ``before`` text, in order."""
    old = commit.before.splitlines(keepends=True)
    new = commit.after.splitlines(keepends=True)
    starts = [0]
    for line in old:
        starts.append(starts[-1] + len(line))
    doc = commit.before
    shift = 0  # how far the current document has moved against the old one
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        pos = starts[i1] + shift
        head, tail = doc[:pos], doc[starts[i2] + shift:]
        typed = "".join(new[j1:j2])
        for k, ch in enumerate(typed):
            nxt = typed[k + 1] if k + 1 < len(typed) else tail[:1]
            if _is_word(ch) and not _is_word(nxt):
                yield Request(head + typed[:k + 1] + tail, pos + k + 1)
        doc = head + typed + tail
        shift += len(typed) - (starts[i2] - starts[i1])
    assert doc == commit.after


def load(path: Path = DEFAULT_TRACE) -> list[Commit]:
    """Commits of a trace file (gzipped JSON written by :func:`save`)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return [Commit(**c) for c in data["commits"]]


def save(commits: list[Commit], path: Path, source: str) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"source": source, "commits": [asdict(c) for c in commits]}, f)


def typed_chars(before: str, after: str) -> int:
    """Characters a replay of ``before`` -> ``after`` types (the changed blocks' new lines)."""
    new = after.splitlines(keepends=True)
    return sum(len("".join(new[j1:j2])) for t, _, _, j1, j2 in
               difflib.SequenceMatcher(None, before.splitlines(True), new, autojunk=False).get_opcodes()
               if t != "equal")


@dataclass(frozen=True)
class Limits:
    """Which changes make a trace: files of ``min_bytes``-``max_bytes`` before the change, and a
    change that types ``min_typed``-``max_typed`` characters."""

    min_bytes: int = 4000
    max_bytes: int = 10**9
    min_typed: int = 200
    max_typed: int = 8000

    def keep(self, c: Commit) -> bool:
        return self.min_bytes <= len(c.before) <= self.max_bytes and \
            self.min_typed <= typed_chars(c.before, c.after) <= self.max_typed


def from_git(repo: Path, files: list[str], limits: Limits = Limits()) -> list[Commit]:
    """Commits of ``repo`` that changed ``files``, oldest first, with a typed change in range."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout

    out = []
    for file in files:
        for line in reversed(git("log", "--format=%H %s", "--", file).splitlines()):
            sha, _, subject = line.partition(" ")
            try:
                before, after = git("show", f"{sha}^:{file}"), git("show", f"{sha}:{file}")
            except subprocess.CalledProcessError:  # the file's first or last commit
                continue
            c = Commit(file, sha[:12], subject, before, after)
            if limits.keep(c):
                out.append(c)
    return out


def from_releases(releases: list[tuple[str, Path]], files: list[str], limits: Limits = Limits()) -> list[Commit]:
    """Changes between consecutive releases of a project, unpacked in ``(version, directory)``
    pairs in release order: one :class:`Commit` per file in ``files`` (relative to each directory)
    that changed within ``limits``, release by release. For projects whose history is at
    hand only as published source archives (``pip download --no-binary :all: NAME==VERSION``)."""
    out = []
    for (v0, d0), (v1, d1) in zip(releases, releases[1:]):
        for file in files:
            p0, p1 = d0 / file, d1 / file
            if not (p0.is_file() and p1.is_file()):
                continue
            before, after = p0.read_text("utf-8"), p1.read_text("utf-8")
            c = Commit(file, f"{v0}..{v1}", f"release {v1}", before, after)
            if before != after and limits.keep(c):
                out.append(c)
    return out
