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

DEFAULT_TRACE = Path(__file__).resolve().parent.parent / "data" / "edit-trace.json.gz"


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


def from_git(repo: Path, files: list[str], min_bytes: int = 4000,
             min_typed: int = 200, max_typed: int = 8000) -> list[Commit]:
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
            typed = sum(len("".join(after.splitlines(keepends=True)[j1:j2])) for t, _, _, j1, j2 in
                        difflib.SequenceMatcher(None, before.splitlines(True), after.splitlines(True),
                                                autojunk=False).get_opcodes() if t != "equal")
            if len(before) >= min_bytes and min_typed <= typed <= max_typed:
                out.append(c)
    return out
