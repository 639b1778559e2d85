"""Where a plan's text and windows start: pure functions of the text and token counts.

- The *character cut*: a file far bigger than a slot is tokenized only around the cursor.
- The *window*: a file's prefix bigger than a slot's room starts at an aligned, sticky token.
- The *near window*: the last 1/NEAR of the room before the anchor (less on a slow model), which a
  reduced plan grows first, and inside it the *nearest window*, a quarter of it, grown before it.
- The *closers*: what an editor's auto-pairs put right after the cursor, left out of the suffix.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# The shares a slower model's near window shrinks to (near_share): on the 1.5B shape (35 tokens/s
# here) an eighth took 18 s, but the 128 tokens nearest the cursor already close three quarters of
# what 32 tokens lose against the whole window (docs/benchmarks-context.md).
NEAR_SHARES = (NEAR, 16, 32, 64)
# The nearest window: the last 1/NEAREST of the near window, grown before it when a cold window's
# reduced plan holds less (a file opened or a jump far down): on the click trace all of the loss
# against the full plans came from the 2-3 s such plans of 40-60 tokens waited for the near plan,
# which a plan of about a hundred of the nearest tokens shortens to under a second.
NEAREST = 4

# What an editor's auto-pairs insert after the cursor. When the text after the cursor differs from
# the anchor's suffix only by a few of these at its start, the anchor is kept: the closers stay
# out of the prompt and the answer stops where it would close them (see stream.py).
CLOSERS = ")]}\"'`"
MAX_CLOSERS = 4


@dataclass(frozen=True)
class Frame:
    """Where the last anchor's pieces sat, so the next one keeps them put: the characters left
    untokenized at the prefix's start and the suffix's end, the window's start, the near window's and
    the nearest window's (tokens of the tokenized prefix text; None: choose anew), and the share the
    near window was cut with (near windows of another share are chosen anew)."""

    cut: tuple[int, int] = (0, 0)
    window: int | None = None
    near_at: int | None = None
    near: int = 0
    nearest_at: int | None = None


def line_start(text: str, offset: int) -> int:
    """Offset of the start of the line holding ``offset``."""
    return text.rfind("\n", 0, offset) + 1


def anchor_at(text: str, cursor: int) -> int:
    """Where a plan anchors for a cursor: the start of its line, or of the line above when the line
    holds indentation and nothing else before the cursor (at column 0: its own start). After
    ``<MID>`` a middle of indentation alone tells a model too little (measured on Qwen2.5-Coder:
    answers jump to the function's end); with the line above it continues the block, as typing from
    an earlier anchor does (docs/models.md)."""
    start = line_start(text, cursor)
    if start and start < cursor and not text[start:cursor].strip(" \t"):
        return line_start(text, start - 1)
    return start


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


def text_end(text: str, cursor: int, span: int) -> int:
    """Where the tokenized text of the suffix after ``cursor`` ends: the end of the line that holds
    its ``span``-th character (or that character, on a very long line)."""
    if len(text) - cursor <= span:
        return len(text)
    nl = text.find("\n", cursor + span, cursor + span + span // 8)
    return nl + 1 if nl >= 0 else cursor + span


def window_step(room: int) -> int:
    """How far a window moves at once: a sixteenth of the prefix's room (a few dozen lines)."""
    return max(16, room // 16)


def window_start(n_prefix: int, room: int, last: int | None) -> int:
    """Where the prefix of a file bigger than a slot starts: the window stays put while the
    cursor moves inside it (so its KV is reused and a cursor jump costs the lines between and
    the suffix), and moves in aligned steps when the cursor leaves it, with one to two steps of
    room below the cursor (typing moves it down). It holds at least ``room`` - 3 steps."""
    need = n_prefix - room  # tokens that must go
    if need <= 0:
        return 0
    step = window_step(room)
    if last is not None and need <= last <= need + 3 * step:
        return last
    return min(-(-(need + step) // step) * step, n_prefix)


def near_start(n_prefix: int, room: int, last: int | None) -> int:
    """Where the near window starts in a window's prefix of ``n_prefix`` tokens (0: none, the
    prefix or the slot is small): as a window starts, but it stays put (``last``) while the prefix
    after it holds half to twice ``room`` tokens, so a cursor moves a few dozen lines first."""
    if room < MIN_NEAR or n_prefix <= room:
        return 0
    if last is not None and 0 < last and room // 2 <= n_prefix - last <= 2 * room:
        return last
    return window_start(n_prefix, room, None)


def near_share(space: int, ms_for, max_ms: float) -> int:
    """The near window's share of a slot's room of ``space`` tokens (it is the last 1/share): the
    largest of ``NEAR_SHARES`` whose near plan (its prefix and a third as many suffix tokens)
    ``ms_for(tokens)`` computes within ``max_ms``; 0 (no near window) when none does."""
    for share in NEAR_SHARES:
        n = space // share
        if n < MIN_NEAR:
            break
        if ms_for(n + n // 3) <= max_ms:
            return share
    return 0


def split(n_prefix: int, n_suffix: int, limit: int, head: int) -> tuple[int, int]:
    """(prefix tail, suffix head) tokens a plan of ``limit`` tokens keeps after a cached ``head``
    of the prefix: nearby context matters most, so up to 3/4 of the rest goes to the prefix's tail."""
    spend = limit - head
    keep_suffix = min(n_suffix, max(spend // 4, spend - (n_prefix - head)))
    return spend - keep_suffix, keep_suffix


def held_after(at: int, n_prefix: int, n_suffix: int, limit: int, head: int) -> int:
    """How many of the prefix's tokens after ``at`` (the nearest the cursor) such a plan holds."""
    tail = split(n_prefix, n_suffix, limit, head)[0]
    return min(n_prefix - at, max(0, head - at) + tail)


def line_closers(suffix_text: str) -> str:
    """The closers that end the cursor's line in ``suffix_text`` (the text after the cursor when its
    anchor was made: a click into ``read(|)``), when nothing else follows on the line ("" otherwise):
    an answer must not write them again (``read('a'))``)."""
    end = suffix_text.find("\n")
    line = (suffix_text if end < 0 else suffix_text[:end]).rstrip(" \t\r")
    return line if 0 < len(line) <= MAX_CLOSERS and all(c in CLOSERS for c in line) else ""


def auto_closers(suffix_text: str, text: str, cursor: int) -> str:
    """The closers an editor's auto-pairs put right after the cursor, if the text after it is
    ``suffix_text`` with only those in front ("" otherwise)."""
    extra = len(text) - cursor - len(suffix_text)
    if not 0 < extra <= MAX_CLOSERS or not text.endswith(suffix_text):
        return ""
    head = text[cursor:cursor + extra]
    return head if all(c in CLOSERS for c in head) else ""
