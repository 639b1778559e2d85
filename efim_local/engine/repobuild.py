"""The idle steps that (re)build a file's repository context and switch its plan to it (issue 25;
the lead itself: ``repoctx.py``).

- The tiers are computed on the repository helper thread (discovery and parsing are bounded but may
  take a second): these steps poll it and yield, so a request never waits for them.
- The T0 head is prefilled alone once per T0 (a state of its own, saved content-addressed: a restart
  restores it), then the file's current plan with the new lead (a reduced plan as it is: growth goes
  on after the switch). Only then does the session switch; its next plan reports ``repo_context``.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

import numpy as np

from ..errors import Cancelled, EfimError
from ..prompt.planner import REPO_CONTEXT
from ..request import Options
from .repoctx import RepoLeads
from .run import RunOptions

log = logging.getLogger("efim.engine")

POLL = 0.005  # seconds between should_stop() polls while the helper thread works


def wait(fut: Future, should_stop):
    """Steps until ``fut`` is done (Cancelled when ``should_stop`` says so: the work goes on, and a
    later run finds it done)."""
    while not fut.done():
        if should_stop is not None and should_stop():
            raise Cancelled()
        time.sleep(POLL)
        yield "wait"
    return fut.result()


class RepoBuild:
    """The idle steps of an engine's repository context (the module's docstring); an engine with
    ``repo_context`` builds it and owns it (``engine.repo_build``)."""

    def __init__(self, engine):
        self.engine = engine

    def rebuild_steps(self, path: str, should_stop=None):
        """(Re)compute ``path``'s lead and, if its session uses another, prefill its current plan with
        the new one and switch to it (idle steps; see the module's docstring)."""
        engine = self.engine
        repo: RepoLeads = engine.repo
        project = repo.project_for(path)
        if project is None or not engine.backend.local_kv or not repo.stale(path):
            return  # (replicas hold no local KV to keep a lead in)
        try:
            ctx = yield wait(repo.built(project), should_stop)
        except Cancelled:
            raise
        except Exception as e:  # noqa: BLE001 - an unreadable project: file-only plans
            log.debug("%s: no repository context: %s", project.root, e)
            return
        f = engine.files.get(path)
        rel = repo.rel(project, path)
        text = f.current if f is not None else None
        if text is None or rel is None:
            return
        stamp = repo.stamp(project, path, text)
        extra = tuple((r, line) for p, line in stamp.defs if (r := repo.rel(project, p)) is not None)
        t0, t1 = yield wait(repo.pool.submit(lambda: (ctx.t0(), ctx.t1(rel, text, extra))), should_stop)
        t2 = project.recent.tier(stamp.recent, repo.open_text, lambda p: repo.rel(project, p))
        lead = repo.render(project, t0, t1, rel, t2, stamp)
        repo.remember(path, lead, project, t0, t1, rel)
        session = f.session
        if session is None or (session.anchor is None and session.lead != lead.tokens):
            # A file opened, no request yet: warm its top after the lead, so that its first request, which
            # adopts a lead whose KV is at hand (adopt()), finds it, and its prefix's head after it.
            with engine.tokenizer.stopping(should_stop):  # a request never waits for the tokenizer
                yield engine.growth.top_steps(path, text, should_stop, lead=lead.tokens)
            return
        if session.lead == lead.tokens:
            return
        bos = engine.planner.markers.bos
        head = (*bos, *lead.tokens[:lead.t0])
        if project.t0_done != lead.t0_digest:  # the T0 head alone: its own saved state, shared by every file
            if engine.reuse.peek(np.asarray(head, dtype=np.int32)) < len(head):
                yield engine.runner.run_steps(head, Options(max_tokens=0), RunOptions(
                    path=f"repo-t0:{project.root}", should_stop=should_stop, chunk=engine.growth.idle_chunk, idle=True,
                    job="repo"))
            project.t0_done = lead.t0_digest
        old = session.anchor
        planner = engine.planner_with(lead.tokens)
        try:
            # A reduced plan switches as it is, after the lead, and grows on from there: the switch costs
            # the lead, not the full plan (which the user's typing may never leave time for).
            room = planner.space(engine.config.max_tokens)
            fits = old.reduced and len(old.prefix_tokens) + len(old.suffix_tokens) <= room
            new = old if fits else planner.full_anchor(old, engine.config.max_tokens)
        except EfimError as e:  # the slot is too small for this lead: not again until the lead changes
            log.debug("%s: repository context left out: %s", path, e)
            repo.mark_unfit(path, lead)
            return
        tokens = planner.stable_tokens(session.layout, new, session.typed)
        yield engine.runner.run_steps(tokens, Options(max_tokens=0), RunOptions(
            path=path, should_stop=should_stop, chunk=engine.growth.idle_chunk, idle=True, job="repo"))
        if engine.files.get(path) is not f or f.session is not session or session.anchor is not old:
            raise Cancelled()  # re-anchored meanwhile: again when idle (what was prefilled stays in its slot)
        repo.use(session, path, lead, lead.tokens)
        session.anchor, session.note = new, REPO_CONTEXT
        engine.reuse.drop_others(path, np.asarray(tokens, dtype=np.int32))
        log.debug("%s: repository context switched (%s)", path, lead.report(lead.tokens))
