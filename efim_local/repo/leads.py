"""A file's lead (issue 25): the repository context its plans start with after BOS, and the projects
and leads of the files the daemon serves.

A lead is the repository's head and T0 (the project map, the same tokens for every file of the
project), then T1 (what this file uses from other files), then T2 (where the user worked lately in
other files: ``recent.py``), then the file's own header, in the model family's repository format
(``prompt/repo_format.py``). This module knows what a lead is made of and when it is stale
(``Stamp``); the engine's side (its KV, the planner's sessions, the learned speed) is
``engine/repoctx.py``, whose ``RepoLeads`` extends ``ProjectLeads`` here:

- a file's project is its git root (``project_for``); a save there updates the project's index
  unless git ignores the file (``update``);
- the tiers are sized to a lead of so many tokens (``tier_limits_for``), a lead takes at most
  ``max_lead`` tokens (``render``);
- a lead is recomputed when its ``Stamp`` differs from the file's: T1 when the file's import lines
  change, a save in the project changed definitions or the editor sent other definitions; T2 when the
  user worked in another file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import EfimError
from ..prompt.plans import FileSession
from ..prompt.repo_format import RepoFormat, current_file, file_pieces, repo_head, tokenize_segments
from ..prompt.templates import Vocab
from . import RepoContext, TierStore
from .discover import git_root, ignored, imports_fingerprint
from .parse import EXTENSIONS
from .recent import EMPTY_T2, T2_CHARS, BlockKey, Recent
from .tiers import Tier, TierLimits, make_tier

log = logging.getLogger("efim.engine")  # the engine's rebuild work: logged under its name as before

MAX_PROJECTS = 4  # projects whose index is kept (each up to the discovery limits)
MAX_LEADS = 256  # files whose computed lead is kept
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


def tier_limits_for(tokens: int) -> TierLimits:
    """The tiers' sizes for a lead of about ``tokens``: the defaults, scaled down when they would
    take more (every change of the lead re-prefills the file's plan while the user types)."""
    d = TierLimits()
    scale = min(1.0, tokens * CHARS_PER_TOKEN / (d.t0_chars + d.t1_chars + T2_CHARS))
    return replace(d, t0_chars=int(d.t0_chars * scale), t1_chars=int(d.t1_chars * scale))


class ProjectLeads:
    """The repository context of a model's files: projects by git root, leads by file, leads in
    format ``fmt`` tokenized by ``vocab``, at most ``max_lead`` tokens each; tiers saved in
    ``tier_dir`` (None: not saved)."""

    def __init__(self, fmt: RepoFormat, vocab: Vocab, max_lead: int, tier_dir: Path | None):
        self.fmt = fmt
        self.vocab = vocab
        self.tiers = TierStore(tier_dir) if tier_dir is not None else None
        self.max_lead = max_lead
        self.lock = threading.Lock()
        self.projects: OrderedDict[str, Project] = OrderedDict()
        self.leads: OrderedDict[str, Lead] = OrderedDict()  # the latest computed, by file
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
                keep_latest(self.projects, MAX_PROJECTS)
            self.projects.move_to_end(root)
            return p

    def built(self, project: Project) -> Future:
        """The project's RepoContext (discovered and parsed on the helper thread, once), its tiers
        sized by ``tier_limits``."""
        with self.lock:
            if project.future is None:
                limits = self.tier_limits()
                project.recent.chars = int(T2_CHARS * limits.t1_chars / TierLimits.t1_chars)
                project.future = self.pool.submit(RepoContext, project.root, tier_limits=limits)
            return project.future

    def lead_budget(self) -> int:
        """About how many tokens a lead may take (an engine's RepoLeads: what prefills in time)."""
        return self.max_lead

    def tier_limits(self) -> TierLimits:
        """The tiers' sizes: for a lead of ``lead_budget`` tokens, at most ``max_lead``."""
        return tier_limits_for(min(self.max_lead, self.lead_budget()))

    def rel(self, project: Project, path: str) -> str | None:
        try:
            return Path(os.path.realpath(path)).relative_to(os.path.realpath(project.root)).as_posix()
        except ValueError:
            return None

    def update(self, project: Project, path: str) -> bool:
        """``path`` changed on disk (saved, created, renamed, deleted): update its project's index if it
        is built. True when the leads of the project's files may change."""
        if project.future is None or not project.future.done():
            return False
        try:
            ctx = project.future.result()
        except Exception:  # noqa: BLE001 - the build failed: nothing to update
            return False
        rel = self.rel(project, path)
        if rel is None or not rel.lower().endswith(tuple(EXTENSIONS)):
            return False
        data = _read(path, ctx.index.limits.max_file_bytes)
        if data is not None and rel not in ctx.index.files and ignored(project.root, rel):
            return False
        if not ctx.saved(rel, data):
            return False
        with self.lock:
            project.gen += 1
        return True

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

    # -- leads --------------------------------------------------------------------------------
    def stamp(self, project: Project, path: str, text: str) -> Stamp:
        """What ``path``'s lead is computed for now (``text``: its current text)."""
        return Stamp(imports_fingerprint(text), project.gen, project.recent.key(path),
                     project.recent.definitions(path))

    def render(self, project: Project, t0: Tier, t1: Tier, rel: str, t2: Tier = EMPTY_T2,
               stamp: Stamp = Stamp()) -> Lead:
        """The lead of file ``rel`` from its tiers (each tier tokenized on its own: T0's tokens are
        the same for every file). T2, then T1, then T0, is left out when the lead would take more
        than ``max_lead`` tokens (an engine's: half the slot)."""
        vocab = self.vocab
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

    def outdated(self, project: Project, path: str, text: str, session: FileSession | None) -> bool:
        """Whether ``path`` (current text ``text``, planned by ``session``) needs its lead (re)computed
        or switched to: none yet, its stamp changed, or its session does not use it yet (unless its
        slot had no room for it)."""
        with self.lock:
            lead = self.leads.get(path)
        if lead is None or lead.stamp != self.stamp(project, path, text):
            return True
        return (session is not None and session.lead != lead.tokens and len(lead.tokens) > 0
                and self.unfit.get(path) != lead.tokens)

    def remember(self, path: str, lead: Lead, project: Project, t0: Tier, t1: Tier, rel: str) -> None:
        with self.lock:
            self.leads[path] = lead
            self.leads.move_to_end(path)
            keep_latest(self.leads)
        if self.tiers is not None:
            try:
                self.tiers.put(t0, project.root)
                self.tiers.put(t1, f"{project.root}\0{rel}")
            except OSError as e:
                log.debug("repository tiers not saved: %s", e)

    def mark_unfit(self, path: str, lead: Lead) -> None:
        """The file's slot has no room for ``lead``: not tried again until the lead changes."""
        with self.lock:
            self.unfit[path] = lead.tokens
            if len(self.unfit) > MAX_LEADS:
                self.unfit.pop(next(iter(self.unfit)))


def keep_latest(d: OrderedDict, n: int = MAX_LEADS) -> None:
    """Drops the least recently used entries of ``d`` beyond ``n``."""
    while len(d) > n:
        d.popitem(last=False)


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
