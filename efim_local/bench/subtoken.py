"""The sub-token evaluation's pieces (`efim bench subtoken`: subtoken_eval.py): cursors at mid-word
and word-boundary positions, prompts built the engine's way, and the probability of the true
continuation computed exactly through llama.cpp, batched over many sequences.

What a score is (docs/models.md, "Sub-token evaluation", defines it for readers):

- ``P(s | prompt)`` is the probability that the model's output *begins with* the bytes ``s``. The
  first token is summed over every token consistent with ``s`` (a proper prefix of ``s``, or a token
  that starts with ``s``); after a first token that is a proper prefix, the rest of ``s`` follows its
  canonical tokenization, and the last step sums over every token starting with the last piece (so a
  target that ends mid-token is not penalised). At temperature 0 this is what the engine samples from.
- *Unhealed* (U): ``P(target | prompt)``, the prompt as the planner builds it, a partial word included.
- *Healed* (H): the engine's token healing (prompt/healing.py): the last typed token ``r`` is backed
  off and every step that has not yet spelled ``r`` out is renormalised over the tokens healing
  allows; ``P_H(r + target)``.
- *Oracle* (O): the exact conditional on the healed prompt, ``P(r + target) / P(r)``: what the
  model believes of the target given the typed text, with no token cut at the cursor. ``U - O`` (in
  bits) is the sub-token loss; ``(U - H) / (U - O)`` is the share of it healing recovers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..llama import Model
from ..prompt.planner import Planner, line_start

CLASSES = ("mid-word", "boundary")
LN2 = float(np.log(2.0))


# -- cursors ----------------------------------------------------------------------------------------
def is_word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "_")


def cursor_class(text: str, i: int) -> str | None:
    """'mid-word' (a word character on both sides), 'boundary' (a word starts here after a space or
    punctuation on the same line), or None."""
    if not 0 < i < len(text) or not is_word(text[i]):
        return None
    if is_word(text[i - 1]):
        return "mid-word"
    return "boundary" if text[i - 1] not in "\r\n" else None


@dataclass(frozen=True)
class Cursor:
    """A cursor in a document: ``hole`` (the rest of its line) is what the user has not typed yet."""

    corpus: str
    doc: int
    offset: int
    cls: str
    line_start: int
    eol: int  # end of the cursor's line (the newline's index)

    def hole(self, text: str) -> str:
        return text[self.offset:self.eol]

    def word(self, text: str) -> str:
        """The rest of the word at the cursor (the whole next word at a boundary)."""
        h = self.hole(text)
        n = 0
        while n < len(h) and is_word(h[n]):
            n += 1
        return h[:n]


def sample_cursors(texts: Sequence[str], cls: str, n: int, rng: random.Random, corpus: str = "",
                   max_line: int = 160) -> list[Cursor]:
    """``n`` distinct cursors of class ``cls``, uniformly over the characters of ``texts`` (rejection
    sampling), on ASCII lines of at most ``max_line`` characters."""
    sizes = np.cumsum([len(t) for t in texts])
    seen: set[tuple[int, int]] = set()
    out: list[Cursor] = []
    for _ in range(n * 400):
        k = rng.randrange(int(sizes[-1]))
        doc = int(np.searchsorted(sizes, k, side="right"))
        text = texts[doc]
        i = k - (int(sizes[doc - 1]) if doc else 0)
        if (doc, i) in seen or cursor_class(text, i) != cls:
            continue
        ls, eol = line_start(text, i), text.find("\n", i)
        eol = len(text) if eol < 0 else eol
        if eol - ls > max_line or not text[ls:eol].isascii():
            continue
        seen.add((doc, i))
        out.append(Cursor(corpus, doc, i, cls, ls, eol))
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} {cls} cursors found in {corpus or 'the corpus'}")


# -- prompts ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One cursor under one prompt layout: what to score and what greedy decoding must produce."""

    prompt: tuple[int, ...]  # the engine's prompt, partial word included
    cut: int | None  # index of the typed text's last token (what healing backs off); None: nothing typed
    target: bytes  # scored: the true next characters
    hole: bytes  # the rest of the line: greedy exact match
    word: bytes  # the rest of the word: greedy exact match


def window_tokens(tokenize: Callable[[str], list[int]], text: str, n: int, tail: bool) -> list[int]:
    """At most ``n`` tokens of ``text``'s end (``tail``) or start, tokenized from a window of 8
    characters a token (the window's cut-off first token is dropped, as a trimmed prefix drops it)."""
    window = 8 * n
    if tail:
        piece = text[-window:] if len(text) > window else text
        toks = tokenize(piece)
        if len(piece) < len(text):
            toks = toks[1:]
        return toks[-n:] if n else []
    piece = text[:window]
    toks = tokenize(piece)
    if len(piece) < len(text):
        toks = toks[:-1]
    return toks[:n]


def infill_job(planner: Planner, text: str, cur: Cursor, layout: str, n_prefix: int, n_suffix: int,
               n_target: int) -> Job:
    """The planner's prompt for a cursor typed into the hole: anchored at the line start, the typed
    part of the line as the middle (after the middle marker for EFIM, ending the prefix for FIM), the
    document after the line as the suffix. Pieces are tokenized separately, as the planner does."""
    tok = planner.tokenize
    prefix = window_tokens(tok, text[:cur.line_start], n_prefix, tail=True)
    middle = tok(text[cur.line_start:cur.offset])
    suffix = window_tokens(tok, text[cur.eol:], n_suffix, tail=False)
    tokens = planner.assemble(layout, prefix, middle, suffix)
    cut = None
    if middle:
        m = planner.markers
        if layout == "efim":
            cut = len(tokens) - 1
        elif m.order == "psm":
            cut = len(m.bos) + len(m.pre) + len(prefix) + len(middle) - 1
        else:
            cut = len(m.bos) + len(m.suf) + len(suffix) + len(m.pre) + len(prefix) + len(middle) - 1
    return _job(tokens, cut, text, cur, n_target)


def l2r_job(model: Model, text: str, cur: Cursor, n_prefix: int, n_target: int) -> Job:
    """A left-to-right prompt: BOS and the last ``n_prefix`` tokens before the cursor, in one piece."""
    toks = window_tokens(model.tokenize, text[:cur.offset], n_prefix, tail=True)
    tokens = (*model.bos, *toks)
    return _job(tokens, len(tokens) - 1 if toks else None, text, cur, n_target)


def _job(tokens, cut, text: str, cur: Cursor, n_target: int) -> Job:
    hole = cur.hole(text)
    return Job(tuple(tokens), cut, hole[:n_target].encode(), hole.encode(), cur.word(text).encode())


def bootstrap(values: np.ndarray, weights: np.ndarray | None = None, n: int = 1000, seed: int = 0,
              ratio_of: np.ndarray | None = None) -> tuple[float, float, float]:
    """(estimate, low, high): a 95% percentile bootstrap over cursors of ``sum(values)/sum(weights)``
    (a mean when ``weights`` is None), or of ``sum(values)/sum(ratio_of)`` (a ratio of sums)."""
    values = np.asarray(values, dtype=np.float64)
    den = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
    if ratio_of is not None:
        den = np.asarray(ratio_of, dtype=np.float64)
    est = values.sum() / den.sum()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    stats = values[idx].sum(axis=1) / den[idx].sum(axis=1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(est), float(lo), float(hi)
