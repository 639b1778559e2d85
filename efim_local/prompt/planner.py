"""EFIM planner: turns (document, cursor, session) into a token plan.

Pure Python, no llama.cpp import: the tokenizer is passed in as a callable.

A plan has three text pieces, each tokenized on its own so that the cached
token prefix stays stable from one keystroke to the next:

- ``prefix``: the document up to the *anchor* (a line start),
- ``middle``: the text typed since the anchor, up to the cursor,
- ``suffix``: the document after the cursor.

Layout ``efim`` puts the middle after the middle marker, where appending to
it invalidates nothing; layout ``fim`` puts it at the end of the prefix, as
standard FIM does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from ..errors import PlanError
from ..request import LAYOUTS
from .windows import (CHARS_PER_TOKEN, MAX_CLOSERS, MIN_NEAR, NEAR, NEAREST, Frame, anchor_at,  # noqa: F401
                      auto_closers, line_closers,
                      held_after, line_start, near_share, near_start, split, text_end, text_start, window_start,
                      window_step)

from .plans import MIN_CONTEXT, Anchor, Budget, FileSession, Markers, Plan, PlannerLimits  # noqa: F401

FRESH = Frame()  # no last anchor: every piece placed anew

Tokenize = Callable[[str], list[int]]

# Re-anchor reason codes (reported to clients, so keep them stable).
NEW_SESSION = "new_session"
EDIT_BEFORE_ANCHOR = "edit_before_anchor"
CURSOR_BEFORE_ANCHOR = "cursor_before_anchor"
SUFFIX_CHANGED = "suffix_changed"
MIDDLE_TOO_LONG = "middle_too_long"
CONTEXT_OVERFLOW = "context_overflow"
LAYOUT_CHANGED = "layout_changed"
LATENCY_BUDGET = "latency_budget"  # the plan was reduced to fit the request's time budget
GROWN = "grown"  # a reduced plan took the context growth computed since (same anchor, more context)
REPO_CONTEXT = "repo_context"  # the repository context before the file changed (engine/repoctx.py)

@dataclass
class Planner:
    """Builds token plans; see the module docstring."""

    tokenize: Tokenize
    markers: Markers
    limits: PlannerLimits = field(default_factory=PlannerLimits)
    near: int = NEAR  # the near window is the last 1/near of the room (0: none; the engine sizes it)
    # A line of indentation alone anchors at the line above (windows.anchor_at); off for a model
    # trained with line-start anchors (fragment-trained: docs/models.md).
    lift_indent: bool = True

    def anchor_offset(self, text: str, cursor: int) -> int:
        """Where a plan for ``cursor`` anchors anew."""
        return anchor_at(text, cursor) if self.lift_indent else line_start(text, cursor)

    def plan(self, session: FileSession, text: str, cursor: int, layout: str | None = None,
             reserve: int | None = None, budget: Budget | None = None,
             pieces: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Plan:
        """Plan a request; ``reserve`` is the room kept for output (default: the limits').

        ``budget``: re-anchor now within a latency budget (see Budget). ``pieces``: the prefix and
        suffix tokens of an anchor just made at this cursor, so they are not tokenized again."""
        reserve = self.limits.reserve_tokens if reserve is None else reserve
        if not 0 <= cursor <= len(text):
            raise PlanError(f"cursor {cursor} is outside the document (0..{len(text)})")
        layout = layout or session.layout
        if layout not in LAYOUTS:
            raise PlanError(f"unknown layout {layout!r} (expected one of {', '.join(LAYOUTS)})")

        reason = self._keep_or_reason(session, text, cursor, layout)
        closers = ""
        if reason == SUFFIX_CHANGED:
            closers = auto_closers(session.anchor.suffix_text, text, cursor)
            reason = None if closers else reason
        if budget is not None:
            reason = LATENCY_BUDGET
        if reason is None:
            anchor = session.anchor
            middle_text = text[anchor.offset:cursor]
            middle = tuple(self.tokenize(middle_text))
            if len(middle) > self.limits.max_middle_tokens:
                reason = MIDDLE_TOO_LONG
            elif self._total(anchor.prefix_tokens, anchor.suffix_tokens, middle, reserve) > self.limits.n_ctx:
                reason = CONTEXT_OVERFLOW
        if reason is not None:
            anchor = self._anchor(text, cursor, reserve, budget, pieces, session.anchor)
            session.anchor = anchor
            session.reanchors += 1
            closers = ""
            middle_text = text[anchor.offset:cursor]
            middle = tuple(self.tokenize(middle_text))
        session.layout = layout
        # After the closers auto-pairs put there since the anchor, those the anchor's line had already
        # (a click into `read(|)`: the answer stops before its `)`, or types over it).
        own = line_closers(anchor.suffix_text)
        closers = closers + own if len(closers) + len(own) <= MAX_CLOSERS else closers
        return self.plan_on(anchor, layout, middle, middle_text, reason, closers)

    def plan_on(self, anchor: Anchor, layout: str, middle: tuple[int, ...], middle_text: str,
                reason: str | None, closers: str = "") -> Plan:
        """The plan of ``anchor`` with ``middle`` typed after it."""
        tokens = self.assemble(layout, anchor.prefix_tokens, middle, anchor.suffix_tokens)
        middle_start = self.middle_start(layout, anchor, len(tokens), len(middle))
        return Plan(
            tokens=tokens,
            middle_start=middle_start,
            layout=layout,
            prefix_tokens=anchor.prefix_tokens,
            middle_tokens=middle,
            suffix_tokens=anchor.suffix_tokens,
            middle_text=middle_text,
            reanchor=reason,
            prefix_trimmed=anchor.prefix_trimmed,
            suffix_trimmed=anchor.suffix_trimmed,
            reduced=anchor.reduced,
            full_context=anchor.full_context,
            head=anchor.head,
            gap=anchor.gap,
            closers=closers,
            cut=anchor.cut,
        )

    def middle_start(self, layout: str, anchor: Anchor, n_tokens: int, n_middle: int) -> int:
        """Index where the middle begins in a plan's tokens: everything before it is stable."""
        m = self.markers
        if layout == "efim":
            return n_tokens - n_middle
        if m.order == "spm":
            return len(m.bos) + len(m.suf) + len(anchor.suffix_tokens) + len(m.pre) + len(anchor.prefix_tokens)
        return len(m.bos) + len(m.pre) + len(anchor.prefix_tokens)

    def stable_tokens(self, layout: str, anchor: Anchor, typed: Sequence[int] = ()) -> tuple[int, ...]:
        """The part of every plan on ``anchor`` that does not depend on the typed middle, and, where
        the middle comes last (EFIM), ``typed[:-1]`` after it: what the next keystroke's plan most
        likely starts with (its last token may change, or be backed off for healing)."""
        tokens = self.assemble(layout, anchor.prefix_tokens, (), anchor.suffix_tokens)
        stable = tokens[:self.middle_start(layout, anchor, len(tokens), 0)]
        return (*stable, *typed[:-1]) if layout == "efim" and len(stable) == len(tokens) else stable

    def full_anchor(self, anchor: Anchor, reserve: int | None = None) -> Anchor:
        """``anchor`` with the context a latency budget trimmed off put back (same texts, same offset)."""
        return self._again(anchor, 0, reserve)

    def near_anchor(self, anchor: Anchor, reserve: int | None = None, nearest: bool = False) -> Anchor | None:
        """``anchor``'s near plan: its prefix from the near window's start (``nearest``: the nearest
        window's), and a third as many suffix tokens (None when the window has no such window: it is
        small)."""
        if not (anchor.inner and self.near):
            return None
        near = self._again(anchor, 0, reserve, near=2 if nearest else 1)
        return near if (near.innermost if nearest else near.inner) else None

    def refit(self, anchor: Anchor, n_middle: int, budget: Budget, reserve: int | None = None) -> Anchor:
        """``anchor`` (same place, same texts) fitted anew to ``budget``, counting what the slots hold
        of its untrimmed pieces now (growth's progress)."""
        return self._again(anchor, n_middle, reserve, budget)

    def _again(self, anchor: Anchor, n_middle: int, reserve: int | None, budget: Budget | None = None,
               near: int = 0) -> Anchor:
        """``anchor``'s untrimmed pieces, in its place, fitted anew (no tokenizing)."""
        reserve = self.limits.reserve_tokens if reserve is None else reserve
        return self._fit(anchor.offset, (anchor.prefix_text, anchor.suffix_text), n_middle, reserve, budget,
                         tokens=(anchor.full_prefix, anchor.full_suffix), frame=anchor.frame, near=near)

    def _cached(self, prefix: Sequence[int], suffix: Sequence[int], cached, space: int) -> tuple[int, int]:
        """What the slots hold of a plan's window, free for a budget: prefix tokens from its top, and,
        once all the prefix is held, suffix tokens from its start (growth computes them in that order)."""
        if self.markers.order == "spm":
            return 0, 0
        lead, top = len(self.head_tokens(())), self.head_tokens(tuple(prefix))
        head = max(0, min(cached(top) - lead, len(prefix), space))
        if head < 16:
            return 0, 0
        if head < len(prefix) or not suffix:
            return head, 0
        held = cached((*top, *self.markers.suf, *suffix)) - len(top) - len(self.markers.suf)
        return head, max(0, min(held, len(suffix), space - head))

    def head_tokens(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        """The tokens a plan starts with, up to and including ``prefix`` (PSM order); () for SPM."""
        m = self.markers
        return () if m.order == "spm" else (*m.bos, *m.pre, *prefix)

    def assemble(self, layout: str, prefix: Sequence[int], middle: Sequence[int],
                 suffix: Sequence[int]) -> tuple[int, ...]:
        """The layout's token sequence from separately tokenized pieces."""
        m = self.markers
        head = (*m.bos, *m.pre, *prefix)
        if layout == "fim":
            head = (*head, *middle)
            tail: tuple[int, ...] = ()
        else:
            tail = tuple(middle)
        if m.order == "spm":
            return (*m.bos, *m.suf, *suffix, *head[len(m.bos):], *m.mid, *tail)
        return (*head, *m.suf, *suffix, *m.mid, *tail)

    def _total(self, prefix: Sequence[int], suffix: Sequence[int], middle: Sequence[int], reserve: int) -> int:
        m = self.markers
        fixed = len(m.bos) + len(m.pre) + len(m.suf) + len(m.mid)
        return fixed + len(prefix) + len(suffix) + len(middle) + reserve

    @staticmethod
    def _keep_or_reason(session: FileSession, text: str, cursor: int, layout: str) -> str | None:
        a = session.anchor
        if a is None:
            return NEW_SESSION
        if layout != session.layout:
            return LAYOUT_CHANGED
        if cursor < a.offset:
            return CURSOR_BEFORE_ANCHOR
        # Plain string comparisons run at memcmp speed; no re-tokenizing here.
        if not text.startswith(a.prefix_text):
            return EDIT_BEFORE_ANCHOR
        if len(text) - cursor != len(a.suffix_text) or not text.endswith(a.suffix_text):
            return SUFFIX_CHANGED
        return None

    def _anchor(self, text: str, cursor: int, reserve: int, budget: Budget | None = None, pieces=None,
                last: Anchor | None = None) -> Anchor:
        offset = self.anchor_offset(text, cursor)
        # (a line far longer than a middle may be, a minified file's: not even tokenized)
        too_long = cursor - offset > self.limits.max_middle_tokens * CHARS_PER_TOKEN
        middle = [] if too_long else self.tokenize(text[offset:cursor])
        if too_long or len(middle) > self.limits.max_middle_tokens:
            offset = cursor  # a very long line: anchor at the cursor itself
            middle = []
        if pieces is not None and last is not None:  # the pieces of ``last``, made at this cursor
            lo, hi = last.cut[0], len(text) - last.cut[1]
        else:
            span = self.text_span(reserve)
            lo = text_start(text, offset, span, last.cut[0] if last is not None else None)
            hi = text_end(text, cursor, span)
        cut = (lo, len(text) - hi)
        frame = replace(last.frame, cut=cut) if last is not None and last.cut[0] == lo else Frame(cut)
        return self._fit(offset, (text[:offset], text[cursor:]), len(middle), reserve, budget, pieces, frame)

    window_step = staticmethod(window_step)

    def text_span(self, reserve: int | None = None) -> int:
        """Characters of text a plan tokenizes at most on each side of the cursor."""
        return self.space(self.limits.reserve_tokens if reserve is None else reserve) * CHARS_PER_TOKEN

    def space(self, reserve: int) -> int:
        """Prefix and suffix tokens a plan holds at most: the slot, less the markers, the room for the
        output (``reserve``) and room for the middle to grow to its limit before re-anchoring."""
        room = min(self.limits.max_middle_tokens, self.limits.n_ctx // 4)
        return self.limits.n_ctx - self._total((), (), (), reserve) - room

    def _fit(self, offset: int, texts: tuple[str, str], n_middle: int, reserve: int,
             budget: Budget | None = None, tokens=None, frame: Frame = FRESH, near: int = 0) -> Anchor:
        """Tokenize the pieces (unless ``tokens`` gives them) less the characters ``cut`` leaves out
        at the prefix's start and the suffix's end, cut the prefix to its window (a file bigger than
        a slot; ``frame``: where the last anchor's cut, window and near window were), trim them to the
        context, and to the latency budget if one is given (see plan()). A budgeted plan starts at
        the near or nearest window when what the slots hold there gives it more of the nearest
        window's lines, then of the near window's, than a plan from the window's cached head has.
        ``near``: the near plan (1) or the nearest (2) (see near_anchor())."""
        prefix_text, suffix_text = texts
        cut = frame.cut
        if tokens:
            prefix, suffix = list(tokens[0]), list(tokens[1])
        else:
            prefix = self.tokenize(prefix_text[cut[0]:])
            suffix = self.tokenize(suffix_text[:len(suffix_text) - cut[1]])
        full = (tuple(prefix), tuple(suffix))
        space = self.space(reserve)
        if space < 16:
            raise PlanError(f"a slot of {self.limits.n_ctx} tokens has no room for a prompt after {reserve} tokens "
                            "of output: ask for fewer (max_tokens) or use larger slots (--n-ctx, n_ctx_seq)")
        # The prefix's share of the context: all but the suffix's (at least a quarter, when it has it).
        prefix_room = space - min(len(suffix), max(space // 4, space - len(prefix)))
        start = window_start(len(prefix), prefix_room, frame.window)
        prefix = prefix[start:]
        limit = space
        full_context = min(space, len(prefix) + len(suffix))
        near_room = space // self.near if self.near else 0
        same = frame.near == self.near
        last = lambda at: at - start if at is not None and same else None
        inner = near_start(len(prefix), near_room, last(frame.near_at))
        innermost = near_start(len(prefix), near_room // NEAREST, last(frame.nearest_at)) if inner else 0
        if 0 < innermost <= inner:  # (kept where the near window starts anew: placed anew too)
            innermost = near_start(len(prefix), near_room // NEAREST, None)
        innermost = innermost if innermost > inner else 0
        reduced, head, held, base = False, 0, 0, 0
        at = (0, inner, innermost)[near]
        if at:
            n = len(prefix) - at
            base, limit, reduced = at, min(space, n + n // 3), True
        elif budget is not None:
            if budget.cached is not None:  # what a slot already holds of the window costs nothing
                head, held = self._cached(prefix, suffix, budget.cached, space)
            fits = self._fits(budget, head + held, n_middle)
            if fits < min(space, len(prefix) + len(suffix)):
                limit, reduced = fits, True
                # or of the near or nearest window, nearer the cursor: the one that holds most of the
                # nearest window's lines, then of the near window's (a near plan grown part of the way
                # holds more of those, with a gap before the lines nearest the cursor)
                ats = [at for at in (innermost, inner) if at]
                score = lambda b, h, lim: [held_after(max(0, at - b), len(prefix) - b, len(suffix), lim, h)
                                           for at in ats]
                best = score(0, head, fits)
                for b in ats if budget.cached is not None else ():
                    h, s = self._cached(prefix[b:], suffix, budget.cached, space)
                    near_fits = min(space, self._fits(budget, h + s, n_middle))
                    if h and (got := score(b, h, near_fits)) > best:
                        best, base, head, held, limit = got, b, h, s, near_fits
            else:
                head = 0
        prefix = prefix[base:]
        over = len(prefix) + len(suffix) - limit
        p_cut = s_cut = 0
        if over > 0:
            keep_tail, keep_suffix = split(len(prefix), len(suffix), limit, head)
            p_cut, s_cut = len(prefix) - head - keep_tail, len(suffix) - keep_suffix
            prefix, suffix = prefix[:head] + prefix[head + p_cut:], suffix[:len(suffix) - s_cut]
        kept = (full[0] if not (p_cut or start or base) else tuple(prefix), full[1] if not s_cut else tuple(suffix))
        return Anchor(offset, prefix_text, kept[0], suffix_text, kept[1], start + base + p_cut, s_cut, reduced, head,
                      *full, window=start, full_context=full_context, cut=cut, inner=inner, base=base,
                      gap=p_cut if head else 0, near=self.near if inner else 0, innermost=innermost)

    def _fits(self, budget: Budget, free: int, n_middle: int) -> int:
        """Prefix and suffix tokens a plan gets within ``budget`` when ``free`` of them are cached.
        However slow the machine, an answer gets some context: one from nothing is noise."""
        return free + max(budget.floor, budget.new_tokens(free) - self._total((), (), (), 0) - n_middle)
