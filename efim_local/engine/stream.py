"""Turning generated tokens into text: partial UTF-8, stop strings, line limits, and where a middle
ends (the block it started in, lines repeated from above the cursor)."""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRules:
    max_tokens: int = 64
    stop_at_newline: bool = False  # stop at the end of the first non-empty line
    max_lines: int | None = None  # stop after this many lines
    stop_strings: tuple[str, ...] = ()
    closers: str = ""  # auto-paired closers after the cursor: stop where the text would close them
    type_over: bool = False  # or type over them, in order, and go on (the answer replaces them: ``typed_over``)
    rejoin: str = ""  # the suffix's first lines: output that reproduces them ends before them (drafts.py)
    # The cursor's line up to the answer and the lines above it (stripped, nearest last): an answer
    # ends before a line that leaves the block it started in or repeats one of those (``_block_cut``).
    line: str | None = None  # None: no such rule (the decoder fills it from the prompt)
    above: tuple[str, ...] = ()

    def replaced(self, text: str) -> int:
        """Characters after the cursor an answer ``text`` replaces: the closers it typed over."""
        return typed_over(text, self.closers)[0] if self.type_over else 0


OPENERS = {")": "(", "]": "[", "}": "{"}
QUOTES = "'\"`"  # strings an answer opens: the brackets in them are text
STRING_PREFIXES = {"r", "b", "f", "u", "rb", "br", "fr", "rf"}  # Python's, before a quote
WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")  # (ASCII: as closers.lua's %w)
MIN_MARKER_TAIL = 2  # at the end of the stream, a tail this long that begins a stop string is dropped
MIN_REPEAT = 8  # non-blank characters a line needs for its repeat of a line above to end an answer
FENCE = "```"  # Markdown: an Instruct model closing (or opening) a code block it imagines


class TextStream:
    """Feeds token bytes, yields safe-to-show text, and decides when to stop.

    Text that could still be the start of a stop string is held back, and so
    are incomplete UTF-8 sequences.
    """

    def __init__(self, rules: StopRules):
        self.rules = rules
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # final, emitted text
        self._pending = ""  # decoded but held back
        self.stop_reason: str | None = None

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the newly emitted text."""
        if self.stop_reason:
            return ""
        self._pending += self._dec.decode(piece)
        return self._scan(final=False)

    def finish(self) -> str:
        if self.stop_reason:  # bytes held back after a stop are never shown
            return ""
        self._pending += self._dec.decode(b"", final=True)
        return self._scan(final=True)

    def _scan(self, final: bool) -> str:
        buf = self.text + self._pending
        cut = None
        for s in self.rules.stop_strings:
            i = buf.find(s, len(self.text) - len(s) + 1 if len(self.text) >= len(s) else 0)
            if i >= 0 and (cut is None or i < cut):
                cut, reason = i, "stop_string"
        if self.rules.rejoin:
            s = self.rules.rejoin
            i = buf.find(s, len(self.text) - len(s) + 1 if len(self.text) >= len(s) else 0)
            if i >= 0 and (cut is None or i < cut):
                cut, reason = i, "rejoin"
        if self.rules.closers:
            i = _over_cut(buf, self.rules.closers) if self.rules.type_over else _closing(buf, self.rules.closers[0])
            if i is not None and (cut is None or i < cut):
                cut, reason = i, "closer"
        if self.rules.line is not None:
            got = _block_cut(buf, self.rules.line, self.rules.above, final)
            if got is not None and (cut is None or got[0] < cut):
                cut, reason = got
        n_lines = self.rules.max_lines or (1 if self.rules.stop_at_newline else None)
        if n_lines:
            i = _nth_line_end(buf, n_lines)
            if i is not None and (cut is None or i < cut):
                cut, reason = i, "newline" if self.rules.stop_at_newline and not self.rules.max_lines else "max_lines"
        if cut is not None:
            self.stop_reason = reason
            out = buf[len(self.text):cut] if cut >= len(self.text) else ""
            self.text = buf[:max(cut, len(self.text))]
            self._pending = ""
            return out
        hold = _held_back(buf, self.rules.stop_strings + ((self.rules.rejoin,) if self.rules.rejoin else ()))
        if final and hold < MIN_MARKER_TAIL:
            hold = 0  # the stream ended on one character of a marker: more likely code ("a <") than a marker
        if self.rules.line is not None and not final:
            hold = max(hold, _line_hold(buf, self.rules.above))
        keep = len(buf) - hold  # final: a longer tail ("</MI") was a marker cut short, never shown
        out = buf[len(self.text):keep] if keep > len(self.text) else ""
        self.text = buf[:max(keep, len(self.text))]
        self._pending = buf[len(self.text):]
        return out


def _closing(buf: str, closer: str) -> int | None:
    """Index of the character in ``buf`` that would close the construct ``closer`` ends (the editor
    already has that closer after the cursor): an unmatched bracket, or an unescaped quote. A string
    the answer opens hides its brackets (``f('a)b')``) until its quote closes it or its line ends."""
    if closer not in OPENERS:  # a quote: the string the cursor is in ends at the next one
        for i, ch in enumerate(buf):
            if ch == closer and (i == 0 or buf[i - 1] != "\\"):
                return i
        return None
    depth, quote = 0, None
    for i, ch in enumerate(buf):
        if quote is not None:
            if ch == "\n" or (ch == quote and buf[i - 1] != "\\"):
                quote = None
        elif ch in QUOTES and _opens(buf, i):
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in OPENERS:
            if depth == 0 and ch == closer:
                return i
            depth = max(0, depth - 1)  # a stray closer of another kind is the model's own
    return None


def _opens(buf: str, i: int) -> bool:
    """Whether the quote at ``buf[i]`` opens a string. An apostrophe does not after a letter, unless
    those letters are a string prefix (``don't``, but ``f'{x}'``), nor after ``&`` or ``<``: a Rust
    lifetime (``&'a str``)."""
    if buf[i] != "'" or i == 0:
        return True
    if buf[i - 1] in "&<":
        return False
    j = i
    while j > 0 and i - j <= 2 and buf[j - 1] in WORD:
        j -= 1
    return j == i or (buf[j:i].lower() in STRING_PREFIXES and (j == 0 or buf[j - 1] not in WORD))


def typed_over(text: str, closers: str) -> tuple[int, int]:
    """How many of ``closers`` (the auto-paired closers after the cursor) ``text`` types over, in
    order, and the index in ``text`` just after the last of them (0, 0: none)."""
    return _over(text, closers)[:2]


def _over_cut(buf: str, closers: str) -> int | None:
    """Where an answer that types over the closers ends: at the first line end it reaches after typing
    over some of them but not all (its next lines would come before the closers left, inside them);
    None: it goes on. A function of the text before the cut alone, however the text arrives."""
    return _over(buf, closers)[2]


def _over(text: str, closers: str) -> tuple[int, int, int | None]:
    """``text`` typing over ``closers`` in order: how many it types over, the index just after the
    last of them, and the first line end after some of them but before the next (None: none)."""
    k = at = 0
    cut = None  # the count goes on past it, as it did before the two walks were one (and closers.lua's)
    for closer in closers:
        i = _closing(text[at:], closer)
        if k and cut is None:  # typed over some: a line end before the next closer ends the answer
            nl = text.find("\n", at, len(text) if i is None else at + i)
            cut = nl if nl >= 0 else None
        if i is None:
            break
        k, at = k + 1, at + i + 1
    return k, at, cut


def _block_cut(buf: str, line: str, above: tuple[str, ...], final: bool) -> tuple[int, str] | None:
    """Where an answer that goes on after the cursor's ``line`` stops being the middle: before a line
    indented less than the block it started in (the first line with content sets it), a new
    top-level statement after a blank line (at indentation 0), a Markdown fence, or a whole line
    that repeats one of the lines just ``above`` the cursor (llama.vim drops such suggestions).
    Returns (index in ``buf`` where the answer ends, reason), or None."""
    full = line + buf
    block, blank, start = None, False, 0
    for n, ln in enumerate(full.split("\n")):
        end = start + len(ln)
        complete = end < len(full) or final
        body = ln.lstrip(" \t").rstrip()
        if not body:
            blank = blank or n > 0
        elif block is None:
            block, blank = len(ln) - len(ln.lstrip(" \t")), False
        else:
            indent = len(ln) - len(ln.lstrip(" \t"))
            reason = ("block" if indent < block or (blank and indent == 0 == block) or body.startswith(FENCE)
                      else "repeat" if complete and len(body) >= MIN_REPEAT and body.strip() in above else None)
            if reason:  # the answer ends with the last line before it that has content
                return max(0, len(full[:start].rstrip(" \t\r\n")) - len(line)), reason
            blank = False
        start = end + 1
    return None


def _line_hold(buf: str, above: tuple[str, ...]) -> int:
    """How much of ``buf``'s end to hold back until its last line shows whether it ends the answer
    (``_block_cut``): blank lines and a line's indentation, and a line that may repeat one above."""
    nl = buf.rfind("\n")
    if nl < 0:
        return 0
    body = buf[nl:].strip()
    if body and not FENCE.startswith(body[:3]) and not any(a.startswith(body) for a in above):
        return 0
    return len(buf) - len(buf[:nl].rstrip(" \t\r\n"))


def _nth_line_end(buf: str, n: int) -> int | None:
    """Index of the newline ending the n-th non-blank line of ``buf``."""
    lead = len(buf) - len(buf.lstrip(" \t\r\n"))
    if lead == len(buf):
        return None
    # Leading blank lines (a completion that starts on the next line) do not count, however the
    # text arrived: the first line starts after the last newline of the leading blanks.
    i = buf.rfind("\n", 0, lead)
    for _ in range(n):
        i = buf.find("\n", i + 1)
        if i < 0:
            return None
    return i


def _held_back(buf: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``buf`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(buf)), best, -1):
            if buf.endswith(s[:k]):
                best = k
                break
    return best
