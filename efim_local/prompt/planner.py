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

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import PlanError
from ..request import LAYOUTS

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

# What an editor's auto-pairs insert after the cursor. When the text after the cursor differs from
# the anchor's suffix only by a few of these at its start, the anchor is kept: the closers stay
# out of the prompt and the answer stops where it would close them (see stream.py).
CLOSERS = ")]}\"'`"
MIN_CONTEXT = 32  # prompt tokens a latency budget always leaves a plan
MAX_CLOSERS = 4
# Characters of text tokenized per token of a slot's room: code averages 3-4 characters a token, so
# the text cut around the cursor holds about twice what a plan can use, and a re-anchor on a file of
# megabytes tokenizes tens of kilobytes, not the file.
CHARS_PER_TOKEN = 8
# The near window: the last 1/NEAR of a slot's room before the anchor (aligned, sticky, as the window
# is). When the cached head of a window does not reach it (a cursor deep in a cold file), a reduced
# plan grows that first, a plan of seconds, not the whole window's tens of seconds, and later plans
# nearby start from it: most of what context is worth is in the tokens nearest the cursor (on the
# click trace, 420 of them scored as well as the whole window; docs/benchmarks-context.md).
NEAR = 8
MIN_NEAR = 64  # tokens of room below which a slot has no near window


@dataclass(frozen=True)
class Markers:
    """Token ids of the FIM markers, as lists (a text-marker template may need several tokens)."""

    pre: tuple[int, ...]
    suf: tuple[int, ...]
    mid: tuple[int, ...]
    order: str = "psm"  # "psm": PRE prefix SUF suffix MID; "spm": SUF suffix PRE prefix MID
    bos: tuple[int, ...] = ()


@dataclass(frozen=True)
class Anchor:
    """Where the cached prefix ends, with the tokens of the three pieces cached."""

    offset: int  # character offset of the anchor in the document
    prefix_text: str
    prefix_tokens: tuple[int, ...]
    suffix_text: str
    suffix_tokens: tuple[int, ...]
    prefix_trimmed: int = 0  # tokens dropped from the prefix's start
    suffix_trimmed: int = 0  # tokens dropped from the suffix's end
    reduced: bool = False  # trimmed to fit a latency budget (idle time grows it back)
    head: int = 0  # reduced: prefix tokens kept from the top of the window, or of its near window (``base``;
    # cached), before the dropped gap
    full_prefix: tuple[int, ...] = ()  # the untrimmed pieces, so a budget or growth never re-tokenizes
    full_suffix: tuple[int, ...] = ()
    window: int = 0  # files bigger than a slot: the prefix starts at this token of its text (aligned, sticky)
    full_context: int = 0  # prefix and suffix tokens of the plan without a latency budget
    cut: tuple[int, int] = (0, 0)  # characters left untokenized at the prefix's start and the suffix's end
    inner: int = 0  # the near window starts at this token of the window's prefix (0: none; aligned, sticky)
    base: int = 0  # this plan's prefix starts at this token of the window's prefix: 0, or ``inner``
    gap: int = 0  # reduced: prefix tokens dropped between the head and the tail nearest the cursor

    @property
    def near_at(self) -> int | None:
        """Where the near window starts in the tokenized prefix text (None: there is none)."""
        return self.window + self.inner if self.inner else None

    def same_place(self, other: Anchor | None) -> bool:
        """Whether ``other`` anchors the same text at the same offset (maybe trimmed otherwise)."""
        return (other is not None and other.offset == self.offset and other.prefix_text == self.prefix_text
                and other.suffix_text == self.suffix_text)


@dataclass
class FileSession:
    """Per-file planning state: the current anchor and layout."""

    anchor: Anchor | None = None
    layout: str = "efim"
    reanchors: int = 0
    typed: tuple[int, ...] = ()  # the last plan's middle tokens (growth computes them too)
    lead: tuple[int, ...] = ()  # repository context after BOS, in every plan of the file (engine/repoctx.py)
    note: str | None = None  # a reason code the next plan reports if it keeps its anchor (repo_context)


@dataclass(frozen=True)
class Plan:
    tokens: tuple[int, ...]
    layout: str
    prefix_tokens: tuple[int, ...]
    middle_tokens: tuple[int, ...]
    suffix_tokens: tuple[int, ...]
    middle_text: str
    reanchor: str | None  # reason code, None when the anchor was kept
    middle_start: int = 0  # index in ``tokens`` where the middle begins: all before it is stable
    prefix_trimmed: int = 0
    suffix_trimmed: int = 0
    reduced: bool = False  # trimmed to fit a latency budget
    full_context: int = 0  # prefix and suffix tokens the plan would have without a latency budget
    head: int = 0  # reduced: prefix tokens kept from the top of the window or near window (cached), before the gap
    gap: int = 0  # reduced: prefix tokens dropped between the head and the tail nearest the cursor
    closers: str = ""  # auto-paired closers right after the cursor that the (kept) suffix lacks
    cut: tuple[int, int] = (0, 0)  # characters left untokenized at the prefix's start and the suffix's end


@dataclass(frozen=True)
class Budget:
    """A latency budget for a re-anchor: ``tokens`` new prompt tokens at most, spent nearest the cursor.
    With ``cached(tokens)`` (how many leading tokens of a sequence the KV cache already holds) the
    cached head of the prefix is kept for free, and ``new_for(n_cached)`` gives the new tokens
    affordable after it."""

    tokens: int | None = None
    cached: Callable[[tuple[int, ...]], int] | None = None
    new_for: Callable[[int], int] | None = None
    floor: int = MIN_CONTEXT  # new tokens a plan gets however slow the machine (0: only what is cached)

    def new_tokens(self, n_cached: int) -> int:
        return self.new_for(n_cached) if self.new_for is not None else self.tokens


@dataclass(frozen=True)
class PlannerLimits:
    n_ctx: int = 4096  # tokens per slot
    max_middle_tokens: int = 96  # re-anchor when the middle grows past this
    reserve_tokens: int = 128  # room kept for the output




def auto_closers(suffix_text: str, text: str, cursor: int) -> str:
    """The closers an editor's auto-pairs put right after the cursor, if the text after it is
    ``suffix_text`` with only those in front ("" otherwise)."""
    extra = len(text) - cursor - len(suffix_text)
    if not 0 < extra <= MAX_CLOSERS or not text.endswith(suffix_text):
        return ""
    head = text[cursor:cursor + extra]
    return head if all(c in CLOSERS for c in head) else ""


def line_start(text: str, offset: int) -> int:
    """Offset of the start of the line holding ``offset``."""
    return text.rfind("\n", 0, offset) + 1


@dataclass
class Planner:
    """Builds token plans; see the module docstring."""

    tokenize: Tokenize
    markers: Markers
    limits: PlannerLimits = field(default_factory=PlannerLimits)

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
        reserve = self.limits.reserve_tokens if reserve is None else reserve
        return self._fit(anchor.offset, (anchor.prefix_text, anchor.suffix_text), 0, reserve,
                         tokens=(anchor.full_prefix, anchor.full_suffix), window=anchor.window, cut=anchor.cut,
                         inner=anchor.near_at)

    def near_anchor(self, anchor: Anchor, reserve: int | None = None) -> Anchor | None:
        """``anchor``'s near plan: its prefix from the near window's start, and a third as many
        suffix tokens (None when the window has no near window: it is small)."""
        if not anchor.inner:
            return None
        reserve = self.limits.reserve_tokens if reserve is None else reserve
        return self._fit(anchor.offset, (anchor.prefix_text, anchor.suffix_text), 0, reserve,
                         tokens=(anchor.full_prefix, anchor.full_suffix), window=anchor.window, cut=anchor.cut,
                         inner=anchor.near_at, near=True)

    def refit(self, anchor: Anchor, n_middle: int, budget: Budget, reserve: int | None = None) -> Anchor:
        """``anchor`` (same place, same texts) fitted anew to ``budget``, counting what the slots hold
        of its untrimmed pieces now (growth's progress); no tokenizing."""
        reserve = self.limits.reserve_tokens if reserve is None else reserve
        return self._fit(anchor.offset, (anchor.prefix_text, anchor.suffix_text), n_middle, reserve, budget,
                         tokens=(anchor.full_prefix, anchor.full_suffix), window=anchor.window, cut=anchor.cut,
                         inner=anchor.near_at)

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
        offset = line_start(text, cursor)
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
            lo = self.text_start(text, offset, span, last.cut[0] if last is not None else None)
            hi = self.text_end(text, cursor, span)
        same = last is not None and last.cut[0] == lo
        return self._fit(offset, (text[:offset], text[cursor:]), len(middle), reserve, budget, pieces,
                         last.window if same else None, cut=(lo, len(text) - hi), inner=last.near_at if same else None)

    def text_span(self, reserve: int | None = None) -> int:
        """Characters of text a plan tokenizes at most on each side of the cursor."""
        return self.space(self.limits.reserve_tokens if reserve is None else reserve) * CHARS_PER_TOKEN

    @staticmethod
    def text_start(text: str, offset: int, span: int, last: int | None = None) -> int:
        """Where the tokenized text of a prefix ending at ``offset`` starts: 0 when the prefix has at
        most ``span`` characters; else a line start that stays put (``last``) while the anchor stays
        between half a span and a span below it, so its tokens and their KV stay the same, and moves
        in aligned steps of an eighth of the span, leaving three quarters of a span to the anchor."""
        if offset <= span:
            return 0
        if last is not None and offset - span <= last <= offset - span // 2 and text[last - 1] == "\n":
            return last
        step = max(1, span // 8)
        lo = line_start(text, (offset - span * 3 // 4) // step * step)
        if offset - lo > span:  # a long line there: the first line start in the span's upper half
            nl = text.find("\n", offset - span, offset - span // 2)
            lo = nl + 1 if nl >= 0 else offset - span
        return lo

    @staticmethod
    def text_end(text: str, cursor: int, span: int) -> int:
        """Where the tokenized text of the suffix after ``cursor`` ends: the end of the line that holds
        its ``span``-th character (or that character, on a very long line)."""
        if len(text) - cursor <= span:
            return len(text)
        nl = text.find("\n", cursor + span, cursor + span + span // 8)
        return nl + 1 if nl >= 0 else cursor + span

    def space(self, reserve: int) -> int:
        """Prefix and suffix tokens a plan holds at most: the slot, less the markers, the room for the
        output (``reserve``) and room for the middle to grow to its limit before re-anchoring."""
        room = min(self.limits.max_middle_tokens, self.limits.n_ctx // 4)
        return self.limits.n_ctx - self._total((), (), (), reserve) - room

    def window_step(self, room: int) -> int:
        """How far a window moves at once: a sixteenth of the prefix's room (a few dozen lines)."""
        return max(16, room // 16)

    def window_start(self, n_prefix: int, room: int, last: int | None) -> int:
        """Where the prefix of a file bigger than a slot starts: the window stays put while the
        cursor moves inside it (so its KV is reused and a cursor jump costs the lines between and
        the suffix), and moves in aligned steps when the cursor leaves it, with one to two steps of
        room below the cursor (typing moves it down). It holds at least ``room`` - 3 steps."""
        need = n_prefix - room  # tokens that must go
        if need <= 0:
            return 0
        step = self.window_step(room)
        if last is not None and need <= last <= need + 3 * step:
            return last
        return min(-(-(need + step) // step) * step, n_prefix)

    def near_start(self, n_prefix: int, room: int, last: int | None) -> int:
        """Where the near window starts in a window's prefix of ``n_prefix`` tokens (0: none, the
        prefix or the slot is small): as a window starts, but it stays put (``last``) while the prefix
        after it holds half to twice ``room`` tokens, so a cursor moves a few dozen lines first."""
        if room < MIN_NEAR or n_prefix <= room:
            return 0
        if last is not None and 0 < last and room // 2 <= n_prefix - last <= 2 * room:
            return last
        return self.window_start(n_prefix, room, None)

    @staticmethod
    def _split(n_prefix: int, n_suffix: int, limit: int, head: int) -> tuple[int, int]:
        """(prefix tail, suffix head) tokens a plan of ``limit`` tokens keeps after a cached ``head``
        of the prefix: nearby context matters most, so up to 3/4 of the rest goes to the prefix's tail."""
        spend = limit - head
        keep_suffix = min(n_suffix, max(spend // 4, spend - (n_prefix - head)))
        return spend - keep_suffix, keep_suffix

    def _held_after(self, at: int, n_prefix: int, n_suffix: int, limit: int, head: int) -> int:
        """How many of the prefix's tokens after ``at`` (the nearest the cursor) such a plan holds."""
        tail = self._split(n_prefix, n_suffix, limit, head)[0]
        return min(n_prefix - at, max(0, head - at) + tail)

    def _fit(self, offset: int, texts: tuple[str, str], n_middle: int, reserve: int,
             budget: Budget | None = None, tokens=None, window: int | None = None,
             cut: tuple[int, int] = (0, 0), inner: int | None = None, near: bool = False) -> Anchor:
        """Tokenize the pieces (unless ``tokens`` gives them) less the characters ``cut`` leaves out
        at the prefix's start and the suffix's end, cut the prefix to its window (a file bigger than
        a slot; ``window``, ``inner``: the last anchor's window and near window starts), trim them to the
        context, and to the latency budget if one is given (see plan()). A budgeted plan starts at
        the near window when what the slots hold there gives it more of the near window's lines than
        a plan from the window's cached head has. ``near``: the near plan (see near_anchor())."""
        prefix_text, suffix_text = texts
        if tokens:
            prefix, suffix = list(tokens[0]), list(tokens[1])
        else:
            prefix = self.tokenize(prefix_text[cut[0]:])
            suffix = self.tokenize(suffix_text[:len(suffix_text) - cut[1]])
        full = (tuple(prefix), tuple(suffix))
        space = self.space(reserve)
        if space < 16:
            raise PlanError(f"context of {self.limits.n_ctx} tokens is too small for this request")
        # The prefix's share of the context: all but the suffix's (at least a quarter, when it has it).
        prefix_room = space - min(len(suffix), max(space // 4, space - len(prefix)))
        start = self.window_start(len(prefix), prefix_room, window)
        prefix = prefix[start:]
        limit = space
        full_context = min(space, len(prefix) + len(suffix))
        inner = self.near_start(len(prefix), space // NEAR, inner - start if inner is not None else None)
        reduced, head, held, base = False, 0, 0, 0
        if near and inner:
            n = len(prefix) - inner
            base, limit, reduced = inner, min(space, n + n // 3), True
        elif budget is not None:
            if budget.cached is not None:  # what a slot already holds of the window costs nothing
                head, held = self._cached(prefix, suffix, budget.cached, space)
            fits = self._fits(budget, head + held, n_middle)
            if fits < min(space, len(prefix) + len(suffix)):
                limit, reduced = fits, True
                if inner and budget.cached is not None:  # or of the near window, nearer the cursor
                    h, s = self._cached(prefix[inner:], suffix, budget.cached, space)
                    near_fits = min(space, self._fits(budget, h + s, n_middle))
                    if h and (self._held_after(0, len(prefix) - inner, len(suffix), near_fits, h)
                              > self._held_after(inner, len(prefix), len(suffix), fits, head)):
                        base, head, held, limit = inner, h, s, near_fits
            else:
                head = 0
        prefix = prefix[base:]
        over = len(prefix) + len(suffix) - limit
        p_cut = s_cut = 0
        if over > 0:
            keep_tail, keep_suffix = self._split(len(prefix), len(suffix), limit, head)
            p_cut, s_cut = len(prefix) - head - keep_tail, len(suffix) - keep_suffix
            prefix, suffix = prefix[:head] + prefix[head + p_cut:], suffix[:len(suffix) - s_cut]
        kept = (full[0] if not (p_cut or start or base) else tuple(prefix), full[1] if not s_cut else tuple(suffix))
        return Anchor(offset, prefix_text, kept[0], suffix_text, kept[1], start + base + p_cut, s_cut, reduced, head,
                      *full, window=start, full_context=full_context, cut=cut, inner=inner, base=base,
                      gap=p_cut if head else 0)

    def _fits(self, budget: Budget, free: int, n_middle: int) -> int:
        """Prefix and suffix tokens a plan gets within ``budget`` when ``free`` of them are cached.
        However slow the machine, an answer gets some context: one from nothing is noise."""
        return free + max(budget.floor, budget.new_tokens(free) - self._total((), (), (), 0) - n_middle)
