"""Which files of a project to read: git's view when the root is in a git work tree (tracked and
untracked files, ``.gitignore`` respected), otherwise a bounded walk. Every limit is a hard bound: files,
bytes per file, total bytes, seconds. Nothing outside the root is read, whatever symlinks say.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("efim.repo")

# Never walked in the fallback (vendored code, environments, caches, VCS data).
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox", "dist", "build", "target", ".idea", ".vscode"})


@dataclass(frozen=True)
class Limits:
    max_files: int = 2000
    max_file_bytes: int = 200_000
    max_total_bytes: int = 8_000_000
    max_seconds: float = 2.0
    max_walk_entries: int = 50_000  # directory entries the fallback walk may look at


@dataclass
class Discovery:
    """The files found (relative posix paths, sorted) and what was left out, by reason."""

    root: Path
    files: list[str]
    sizes: dict[str, int]
    skipped: dict[str, int] = field(default_factory=dict)
    source: str = "git"  # "git" or "walk"

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def git_files(root: Path, timeout: float) -> list[str] | None:
    """``git ls-files -co --exclude-standard`` under ``root`` (paths relative to it), or None when the
    root is not in a git work tree or git is missing."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                           capture_output=True, timeout=max(timeout, 0.1), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _ignore_patterns(root: Path) -> list[str]:
    """The root .gitignore's simple patterns (the fallback's approximation of git's rules)."""
    try:
        lines = (root / ".gitignore").read_text("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [ln.strip().rstrip("/") for ln in lines if ln.strip() and not ln.startswith(("#", "!"))]


def _ignored(rel: str, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pat in patterns:
        p = pat.lstrip("/")
        if fnmatch.fnmatch(rel, p) or ("/" not in pat and fnmatch.fnmatch(name, p)):
            return True
    return False


def ignored(root: str | os.PathLike, rel: str) -> bool:
    """Whether discovery leaves file ``rel`` out as ignored (a file created after discovery): git's
    rules in a git work tree, else the root ``.gitignore``'s patterns."""
    try:
        r = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "--", rel], capture_output=True, timeout=2,
                           check=False)
        if r.returncode in (0, 1):
            return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        pass
    return _ignored(rel, _ignore_patterns(Path(root)))


def walk_files(root: Path, limits: Limits, deadline: float) -> list[str]:
    """A sorted, bounded walk that never descends into symlinked directories or SKIP_DIRS."""
    patterns = _ignore_patterns(root)
    out: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")
                             and not _ignored(rel_dir + d, patterns))
        for name in sorted(filenames):
            seen += 1
            if not _ignored(rel_dir + name, patterns):
                out.append(rel_dir + name)
        if seen > limits.max_walk_entries or time.monotonic() > deadline:
            break
    return sorted(out)


def utf8_name(rel: str) -> bool:
    """Whether a path can go into a prompt: a file name that is not UTF-8 comes from git and
    ``os.walk`` with its bytes as surrogates, which no tokenizer, JSON text or digest takes."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def inside(root_real: str, path: str) -> bool:
    """``path`` (resolved) is ``root_real`` or under it."""
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real + os.sep)


def discover(root: str | os.PathLike, limits: Limits = Limits(), suffixes: tuple[str, ...] | None = None) -> Discovery:
    """The project's files under ``root`` with a known suffix, within ``limits`` (deterministic: sorted
    paths; when a limit is hit the files after it in that order are left out)."""
    start = time.monotonic()
    deadline = start + limits.max_seconds
    root = Path(root)
    root_real = os.path.realpath(root)
    listed = git_files(root, limits.max_seconds)
    found = Discovery(root, [], {}, source="git" if listed is not None else "walk")
    if listed is None:
        listed = walk_files(root, limits, deadline)
    total = 0
    for rel in sorted(set(listed)):
        if suffixes is not None and not rel.lower().endswith(suffixes):
            continue
        if not utf8_name(rel):
            found.skip("name_not_utf8")
            continue
        if time.monotonic() > deadline:
            found.skip("time")
            continue
        if len(found.files) >= limits.max_files:
            found.skip("max_files")
            continue
        full = os.path.join(root_real, rel)
        try:
            st = os.stat(full)  # follows a symlink: its target is checked below
        except OSError:
            found.skip("missing")  # listed by git, deleted in the work tree
            continue
        if not inside(root_real, full):
            found.skip("outside_root")
            continue
        if not os.path.isfile(full):
            found.skip("not_a_file")
            continue
        if st.st_size > limits.max_file_bytes:
            found.skip("max_file_bytes")
            continue
        if total + st.st_size > limits.max_total_bytes:
            found.skip("max_total_bytes")
            continue
        total += st.st_size
        found.files.append(rel)
        found.sizes[rel] = st.st_size
    if found.skipped.get("name_not_utf8"):
        log.info("%s: left out %d file(s) whose name is not UTF-8", root, found.skipped["name_not_utf8"])
    return found


def git_root(directory: str) -> str | None:
    """The nearest directory at or above ``directory`` that holds ``.git``."""
    d = directory
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return d
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up


def imports_fingerprint(text: str) -> str:
    """A hash of the lines that may import something (a cheap test after each request: T1 is only
    recomputed when it changes; the parser decides what the lines mean). A line that opens a
    bracket after ``import`` takes the lines up to the closing one (Python, Go, JS blocks)."""
    h = hashlib.sha1()
    block = None
    for line in text.splitlines():
        s = line.strip()
        if block is not None:
            h.update(s.encode("utf-8", "surrogatepass") + b"\n")
            if block in s:
                block = None
            continue
        if ("import" in s or "require(" in s or s.startswith(("from ", "package ", "#include", "use "))):
            h.update(s.encode("utf-8", "surrogatepass") + b"\n")
            if s.endswith(("(", "{")):
                block = ")" if s.endswith("(") else "}"
    return h.hexdigest()
