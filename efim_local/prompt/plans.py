"""The planner's data: FIM markers, a file's anchor and session, a plan, a latency budget, limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .windows import Frame

MIN_CONTEXT = 32  # prompt tokens a latency budget always leaves a plan


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
    head: int = 0  # reduced: prefix tokens kept from the top of the window, or of its near or nearest window
    # (``base``; cached), before the dropped gap
    full_prefix: tuple[int, ...] = ()  # the untrimmed pieces, so a budget or growth never re-tokenizes
    full_suffix: tuple[int, ...] = ()
    window: int = 0  # files bigger than a slot: the prefix starts at this token of its text (aligned, sticky)
    full_context: int = 0  # prefix and suffix tokens of the plan without a latency budget
    cut: tuple[int, int] = (0, 0)  # characters left untokenized at the prefix's start and the suffix's end
    inner: int = 0  # the near window starts at this token of the window's prefix (0: none; aligned, sticky)
    innermost: int = 0  # the nearest window (inside the near window) starts here (0: none; aligned, sticky)
    base: int = 0  # this plan's prefix starts at this token of the window's prefix: 0, ``inner`` or ``innermost``
    gap: int = 0  # reduced: prefix tokens dropped between the head and the tail nearest the cursor
    near: int = 0  # the near window is the last 1/near of the room (the planner's share when it was cut)

    @property
    def near_at(self) -> int | None:
        """Where the near window starts in the tokenized prefix text (None: there is none)."""
        return self.window + self.inner if self.inner else None

    @property
    def frame(self) -> Frame:
        """Where this anchor's pieces sit, for the next anchor to keep them put."""
        nearest_at = self.window + self.innermost if self.innermost else None
        return Frame(self.cut, self.window, self.near_at, self.near, nearest_at)

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
    lead: tuple[int, ...] = ()  # repository context after BOS, in every plan of the file (repo/leads.py)
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
    head: int = 0  # reduced: prefix tokens kept from the top of the window, near or nearest window (cached),
    # before the gap
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
