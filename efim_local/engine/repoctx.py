"""Repository context in plans (issue 25): a stable lead before every plan of a file.

A file's plans start with ``BOS + lead``: the repository's head and T0 (the project map, the same
tokens for every file of the project), then T1 (what this file uses from other files), then T2 (where
the user worked lately in other files: ``repo/recent.py``), then the file's own header, in the model
family's repository format (``prompt/repo_format.py``). The planner takes the
lead as part of its BOS marker (``Engine.planner_for``), so it is never trimmed, its KV is reused like
the file's prefix, and a keystroke never prefills it:

- a new session of a file takes the lead known for it only when its KV is at hand (a live slot or a
  saved state, e.g. after a restart); otherwise the file's plan is file-only until the rebuild;
- the rebuild (``RepoBuild.rebuild_steps``, idle work) computes the tiers, prefills the new plan and
  only then switches the session to it; after a request it goes before the file's growth (which would
  grow the plan about to be replaced);
- the tiers are sized so that the lead prefills in about ``LEAD_S`` at the learned speed;
- a lead is recomputed when its ``Stamp`` differs from the file's: T1 when the file's import lines
  change, a save in the project changed definitions or the editor sent other definitions; T2 when the
  user worked in another file (``stale``, a cheap test after each request and settled cursor), never
  on a keystroke.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import EfimError
from ..prompt.planner import FileSession
from ..prompt.repo_format import current_file, file_pieces, repo_format, repo_head, tokenize_segments
from ..repo import RepoContext, Tier, TierLimits, TierStore, make_tier
from ..repo.discover import git_root, ignored, imports_fingerprint
from ..repo.parse import EXTENSIONS
from ..repo.recent import EMPTY_T2, T2_CHARS, BlockKey, Recent

log = logging.getLogger("efim.engine")

MAX_PROJECTS = 4  # projects whose index is kept (each up to the discovery limits)
MAX_LEADS = 256  # files whose computed lead is kept
LEAD_S = 6.0  # a project's tiers are sized so that its lead prefills in about this long on this machine
CHARS_PER_TOKEN = 3.0  # of definitions and code, about (a code vocabulary gives 3-4)
EMPTY_T1 = make_tier("t1", ())


@dataclass(frozen=True)
class Stamp:
    """What a lead was computed for; it is stale once the file's current stamp differs."""

    fp: str = ""  # the import fingerprint of the file's text ("": restored from disk)
    gen: int = -1  # the project's generation (bumped when a save changed definitions or imports)
    recent: BlockKey = ()  # the blocks of other files its T2 holds
    defs: tuple = ()  # the editor's definitions its T1 was computed with


@dataclass(frozen=True)
class Lead:
    """A file's lead tokens: ``t0`` of them the repository head and T0, ``t1`` T1, ``t2`` T2, the rest
    its header."""

    tokens: tuple[int, ...]
    t0: int
    t1: int
    t0_digest: str
    t2: int = 0
    stamp: Stamp = Stamp()

    def t0_only(self) -> tuple[int, ...]:
        return self.tokens[:self.t0] + self.tokens[self.t0 + self.t1 + self.t2:]

    def report(self, tokens: tuple[int, ...]) -> dict:
        """Tokens per tier of ``tokens`` (this lead or its T0-only form)."""
        full = len(tokens) == len(self.tokens)
        t1, t2 = (self.t1, self.t2) if full else (0, 0)
        return {"t0_tokens": self.t0, "t1_tokens": t1, "t2_tokens": t2,
                "file_tokens": len(tokens) - self.t0 - t1 - t2, "tokens": len(tokens)}


@dataclass
class Project:
    root: str
    name: str
    future: Future | None = None  # the RepoContext being built
    gen: int = 0  # bumped when a save changed definitions or imports
    t0_done: str = ""  # the T0 digest whose head was prefilled alone (its state saved)
    recent: Recent = field(default_factory=Recent)  # T2's blocks, the editor's definitions


class RepoLeads:
    """The repository context of an engine's files: projects by git root, leads by file."""

    def __init__(self, engine, tier_dir: Path | None):
        self.engine = engine
        self.fmt = repo_format(engine.template, engine.model)
        self.tiers = TierStore(tier_dir) if tier_dir is not None else None
        self.max_lead = engine.config.context.n_ctx_seq // 2
        self.lock = threading.Lock()
        self.projects: OrderedDict[str, Project] = OrderedDict()
        self.leads: OrderedDict[str, Lead] = OrderedDict()  # the latest computed, by file
        self.used: OrderedDict[str, tuple[tuple[int, ...], dict]] = OrderedDict()  # a session's lead, its report
        self.roots: dict[str, str | None] = {}
        self.unfit: dict[str, tuple[int, ...]] = {}  # a lead the file's slot has no room for (not retried)
        self.pool = ThreadPoolExecutor(1, "efim-repo", initializer=_low_priority)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- projects -----------------------------------------------------------------------------
    def project_for(self, path: str | None) -> Project | None:
        """The project (git root) ``path`` is in; None for a relative path or one outside a git tree."""
        if not path or not os.path.isabs(path):
            return None
        d = os.path.dirname(path)
        with self.lock:
            if d not in self.roots:
                if len(self.roots) > 4096:
                    self.roots.clear()
                self.roots[d] = git_root(d)
            root = self.roots[d]
            if root is None:
                return None
            p = self.projects.get(root)
            if p is None:
                p = self.projects[root] = Project(root, Path(root).resolve().name)
                while len(self.projects) > MAX_PROJECTS:
                    self.projects.popitem(last=False)
            self.projects.move_to_end(root)
            return p

    def built(self, project: Project) -> Future:
        """The project's RepoContext (discovered and parsed on the helper thread, once), its tiers
        sized for this machine (``tier_limits``)."""
        with self.lock:
            if project.future is None:
                limits = self.tier_limits()
                project.recent.chars = int(T2_CHARS * limits.t1_chars / TierLimits.t1_chars)
                project.future = self.pool.submit(RepoContext, project.root, tier_limits=limits)
            return project.future

    def tier_limits(self) -> TierLimits:
        """The tiers' sizes: the defaults, scaled down so that the whole lead prefills in about
        ``LEAD_S`` at the engine's learned speed (a slow machine or a big model gets a smaller lead:
        every change of it re-prefills the file's plan while the user types)."""
        d = TierLimits()
        speed = self.engine.speed
        tokens = min(self.max_lead, speed.max_new(LEAD_S * 1000) if speed.known else self.max_lead)
        scale = min(1.0, tokens * CHARS_PER_TOKEN / (d.t0_chars + d.t1_chars + T2_CHARS))
        return replace(d, t0_chars=int(d.t0_chars * scale), t1_chars=int(d.t1_chars * scale))

    def rel(self, project: Project, path: str) -> str | None:
        try:
            return Path(os.path.realpath(path)).relative_to(os.path.realpath(project.root)).as_posix()
        except ValueError:
            return None

    # -- leads --------------------------------------------------------------------------------
    def stamp(self, project: Project, path: str, text: str) -> Stamp:
        """What ``path``'s lead is computed for now (``text``: its current text)."""
        return Stamp(imports_fingerprint(text), project.gen, project.recent.key(path),
                     project.recent.definitions(path))

    def render(self, project: Project, t0: Tier, t1: Tier, rel: str, t2: Tier = EMPTY_T2,
               stamp: Stamp = Stamp()) -> Lead:
        """The lead of file ``rel`` from its tiers (each tier tokenized on its own: T0's tokens are
        the same for every file). T2, then T1, then T0, is left out when the lead would take more
        than half the slot."""
        vocab = self.engine.model
        head = tokenize_segments(repo_head(self.fmt, project.name) + file_pieces(self.fmt, t0.pieces), vocab)
        mid = tokenize_segments(file_pieces(self.fmt, t1.pieces), vocab)
        vol = tokenize_segments(file_pieces(self.fmt, t2.pieces), vocab) if t2.pieces else []
        tail = tokenize_segments(current_file(self.fmt, rel), vocab)
        if len(head) + len(mid) + len(vol) + len(tail) > self.max_lead:
            vol = []
        if len(head) + len(mid) + len(tail) > self.max_lead:
            mid = []
        if len(head) + len(tail) > self.max_lead:
            head = tokenize_segments(repo_head(self.fmt, project.name), vocab)
        return Lead(tuple(head + mid + vol + tail), len(head), len(mid), t0.digest, len(vol), stamp)

    def known(self, project: Project, path: str) -> Lead | None:
        """The lead last computed for ``path``, else the one its saved tiers give (after a restart)."""
        with self.lock:
            lead = self.leads.get(path)
        if lead is not None or self.tiers is None:
            return lead
        rel = self.rel(project, path)
        t0 = self.tiers.latest(project.root)
        if t0 is None or rel is None:
            return None
        return self.render(project, t0, self.tiers.latest(f"{project.root}\0{rel}") or EMPTY_T1, rel)

    def cached(self, tokens: tuple[int, ...]) -> int:
        """How many of ``tokens`` a live slot or a saved state holds."""
        arr = np.asarray(tokens, dtype=np.int32)
        n = self.engine.reuse.peek(arr)
        store = self.engine.store
        if n < len(tokens) and store is not None:
            m = store.lookup(arr).match
            n = max(n, m.n if m is not None else 0)
        return n

    def adopt(self, session: FileSession, path: str) -> None:
        """A new session of ``path`` takes its known lead, or the T0 part of it, if its KV is at hand
        (a live slot or a saved state); else it plans file-only until the rebuild."""
        project = self.project_for(path)
        lead = self.known(project, path) if project is not None else None
        if lead is None:
            return
        bos = self.engine.planner.markers.bos
        # A sliding-window model's saved state ends a token short of its prompt (its checkpoint).
        slack = 1 if self.engine.swa else 0
        for tokens, tiers in ((lead.tokens, lead.t0 + lead.t1 + lead.t2), (lead.t0_only(), lead.t0)):
            if self.cached((*bos, *tokens[:tiers])) >= len(bos) + tiers - slack:
                self.use(session, path, lead, tokens)
                return

    def use(self, session: FileSession, path: str, lead: Lead, tokens: tuple[int, ...]) -> None:
        """``session`` plans with ``tokens`` (``lead`` or its T0-only form) from now on."""
        session.lead = tokens
        with self.lock:
            self.used[path] = (tokens, lead.report(tokens))
            self.used.move_to_end(path)
            self._trim()

    def _trim(self) -> None:
        for d in (self.leads, self.used):
            while len(d) > MAX_LEADS:
                d.popitem(last=False)

    def report(self, path: str | None) -> dict:
        """The repository context of ``path``'s current plans: tokens per tier."""
        f = self.engine.files.get(path) if path else None
        lead_tokens = f.session.lead if f is not None and f.session is not None else ()
        with self.lock:
            used = self.used.get(path)
        if used is not None and used[0] == lead_tokens and lead_tokens:
            return dict(used[1])
        return {"t0_tokens": 0, "t1_tokens": 0, "t2_tokens": 0, "file_tokens": 0, "tokens": len(lead_tokens)}

    def stale(self, path: str | None) -> bool:
        """Whether ``path``'s lead must be (re)computed or switched to: none yet, its import lines
        changed, a save changed the project, the editor's definitions or T2's blocks changed, or its
        session does not use it yet."""
        project = self.project_for(path)
        f = self.engine.files.get(path) if project is not None else None
        if f is None or f.current is None:
            return False
        with self.lock:
            lead = self.leads.get(path)
        if lead is None or lead.stamp != self.stamp(project, path, f.current):
            return True
        return (f.session is not None and f.session.lead != lead.tokens and len(lead.tokens) > 0
                and self.unfit.get(path) != lead.tokens)

    def saved(self, path: str) -> list[str]:
        """A file changed on disk (saved, created, renamed, deleted): update its project's index if
        it is built. Returns the open documents of the project whose lead may change (rebuild them)."""
        project = self.project_for(path)
        if project is None or project.future is None or not project.future.done():
            return []
        try:
            ctx = project.future.result()
        except Exception:  # noqa: BLE001 - the build failed: nothing to update
            return []
        rel = self.rel(project, path)
        if rel is None or not rel.lower().endswith(tuple(EXTENSIONS)):
            return []
        data = _read(path, ctx.index.limits.max_file_bytes)
        if data is not None and rel not in ctx.index.files and ignored(project.root, rel):
            return []
        if not ctx.saved(rel, data):
            return []
        with self.lock:
            project.gen += 1
        return [p for p in self.engine.files.open_paths() if p != path and self.project_for(p) is project]

    def visit(self, path: str | None, cursor: int | None = None) -> None:
        """The user worked in ``path`` at ``cursor`` (default: its last one; a request that ended, a
        settled cursor): its block joins T2 of the project's other files."""
        project = self.project_for(path)
        f = self.engine.files.get(path) if project is not None else None
        cursor = cursor if cursor is not None or f is None else f.cursor
        if f is not None and f.open and f.text is not None and cursor is not None:
            project.recent.visit(path, f.text, cursor, f.version)

    def set_definitions(self, path: str, locations) -> tuple[bool, int]:
        """The definitions the editor resolved for ``path`` ((absolute file, 0-based line) pairs; those
        of other projects are left out): whether they changed (its lead is then stale), and how many
        are kept."""
        project = self.project_for(path)
        if project is None:
            return False, 0
        inside = [(p, line) for p, line in locations if os.path.isabs(p) and self.rel(project, p) is not None]
        return project.recent.set_definitions(path, inside), len(project.recent.definitions(path))

    def closed(self, path: str) -> None:
        """``path`` was closed: it leaves T2 of the project's other files."""
        project = self.project_for(path)
        if project is not None:
            project.recent.forget(path)

    def mark_unfit(self, path: str, lead: Lead) -> None:
        """The file's slot has no room for ``lead``: not tried again until the lead changes."""
        with self.lock:
            self.unfit[path] = lead.tokens
            if len(self.unfit) > MAX_LEADS:
                self.unfit.pop(next(iter(self.unfit)))

    def open_text(self, path: str) -> str | None:
        f = self.engine.files.get(path)
        return f.text if f is not None and f.open else None

    def remember(self, path: str, lead: Lead, project: Project, t0: Tier, t1: Tier, rel: str) -> None:
        with self.lock:
            self.leads[path] = lead
            self.leads.move_to_end(path)
            self._trim()
        if self.tiers is not None:
            try:
                self.tiers.put(t0, project.root)
                self.tiers.put(t1, f"{project.root}\0{rel}")
            except OSError as e:
                log.debug("repository tiers not saved: %s", e)


def _low_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


def _read(path: str, limit: int) -> bytes | None:
    """A regular file's first ``limit`` bytes; None when it is gone or not a regular file."""
    from ..prompt.document import open_regular

    try:
        fd, _ = open_regular(path, follow=False)
    except (EfimError, OSError):
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
