"""Repository context in plans (issue 25): a stable lead before every plan of a file.

A file's plans start with ``BOS + lead`` (what a lead is, the projects and when a lead is stale:
``repo/leads.py``). This module is the engine's side of it: the lead's KV, the planner's sessions,
the learned speed and the engine's open files. The planner takes the lead as part of its BOS marker
(``Engine.planner_for``), so it is never trimmed, its KV is reused like the file's prefix, and a
keystroke never prefills it:

- a new session of a file takes the lead known for it only when its KV is at hand (a live slot or a
  saved state, e.g. after a restart); otherwise the file's plan is file-only until the rebuild;
- the rebuild (``RepoBuild.rebuild_steps``, idle work) computes the tiers, prefills the new plan and
  only then switches the session to it; after a request it goes before the file's growth (which would
  grow the plan about to be replaced);
- the tiers are sized so that the lead prefills in about ``LEAD_S`` at the learned speed;
- a stale lead (``stale``: a cheap test after each request and settled cursor) is rebuilt, never on
  a keystroke.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..prompt.planner import FileSession
from ..prompt.repo_format import repo_format
from ..repo.leads import Lead, ProjectLeads, keep_latest

LEAD_S = 6.0  # a project's tiers are sized so that its lead prefills in about this long on this machine


class RepoLeads(ProjectLeads):
    """The repository context of an engine's files: ``ProjectLeads`` in the engine's model format,
    with the lead's KV, the files' sessions and the engine's speed."""

    def __init__(self, engine, tier_dir: Path | None):
        super().__init__(repo_format(engine.template, engine.model), engine.model,
                         engine.config.context.n_ctx_seq // 2, tier_dir)
        self.engine = engine
        self.used: OrderedDict[str, tuple[tuple[int, ...], dict]] = OrderedDict()  # a session's lead, its report

    def lead_budget(self) -> int:
        """What prefills in about ``LEAD_S`` at the engine's learned speed (a slow machine or a big model
        gets a smaller lead: every change of it re-prefills the file's plan while the user types)."""
        speed = self.engine.speed
        return speed.max_new(LEAD_S * 1000) if speed.known else self.max_lead

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
            keep_latest(self.used)

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
        """Whether ``path``'s lead must be (re)computed or switched to (``outdated``), for its open
        document."""
        project = self.project_for(path)
        f = self.engine.files.get(path) if project is not None else None
        if f is None or f.current is None:
            return False
        return self.outdated(project, path, f.current, f.session)

    def saved(self, path: str) -> list[str]:
        """A file changed on disk (``update``). Returns the open documents of the project whose lead may
        change (rebuild them)."""
        project = self.project_for(path)
        if project is None or not self.update(project, path):
            return []
        return [p for p in self.engine.files.open_paths() if p != path and self.project_for(p) is project]

    def visit(self, path: str | None, cursor: int | None = None) -> None:
        """The user worked in ``path`` at ``cursor`` (default: its last one; a request that ended, a
        settled cursor): its block joins T2 of the project's other files."""
        project = self.project_for(path)
        f = self.engine.files.get(path) if project is not None else None
        cursor = cursor if cursor is not None or f is None else f.cursor
        if f is not None and f.open and f.text is not None and cursor is not None:
            project.recent.visit(path, f.text, cursor, f.version)

    def open_text(self, path: str) -> str | None:
        f = self.engine.files.get(path)
        return f.text if f is not None and f.open else None
