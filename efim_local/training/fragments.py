"""Training data: fragment tokenization and plain / FIM / EFIM samples.

Fragment tokenization (EFIM paper): split the text at random character
positions, mid-word included, and tokenize each fragment on its own, so the
model sees word pieces at token boundaries and learns to continue a partial
word. The split rule is ours: cut points are drawn per character with
probability ``rate`` (about one cut every ``1/rate`` characters).

EFIM samples mirror what the planner sends at inference:
``[PRE] prefix head [SUF] suffix [MID] middle head`` + target middle + EOT,
where the middle head (the text typed since the anchor) usually ends
mid-word and is tokenized separately from the target.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class Specials:
    pre: int
    suf: int
    mid: int
    eot: int


@dataclass(frozen=True)
class SampleConfig:
    fragment_rate: float = 1 / 24  # cut points per character (0: plain tokenization)
    p_plain: float = 0.2  # left-to-right samples
    p_fim: float = 0.3  # FIM samples (half PSM, half SPM); the rest are EFIM
    max_middle_chars: int = 256  # longest target middle
    p_anchor_line_start: float = 0.8  # EFIM anchor at the cursor's line start, as the planner does


@dataclass
class Sample:
    ids: list[int]
    loss: list[bool]  # which positions' *next* token is trained (the target middle, EOT included)
    kind: str


def split_fragments(text: str, rng: random.Random, rate: float) -> list[str]:
    """Cut ``text`` at random character positions; the pieces concatenate back to ``text``."""
    if rate <= 0 or len(text) < 2:
        return [text] if text else []
    n_cuts = sum(rng.random() < rate for _ in range(len(text) - 1)) if len(text) < 64 else \
        min(len(text) - 1, _binomial(rng, len(text) - 1, rate))
    cuts = sorted(rng.sample(range(1, len(text)), n_cuts))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _binomial(rng: random.Random, n: int, p: float) -> int:
    # Normal approximation is plenty for cut counts; clamp to [0, n].
    mean, sd = n * p, (n * p * (1 - p)) ** 0.5
    return max(0, min(n, round(rng.gauss(mean, sd))))


def fragment_tokenize(text: str, tokenize: Tokenize, rng: random.Random, rate: float) -> list[int]:
    """Tokenize each random fragment of ``text`` on its own and concatenate the ids."""
    out: list[int] = []
    for frag in split_fragments(text, rng, rate):
        out += tokenize(frag)
    return out


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def make_sample(text: str, tokenize: Tokenize, sp: Specials, rng: random.Random,
                cfg: SampleConfig = SampleConfig()) -> Sample:
    """One training sample of a random kind from ``text``."""
    tok = lambda s: fragment_tokenize(s, tokenize, rng, cfg.fragment_rate)
    r = rng.random()
    if r < cfg.p_plain or len(text) < 8:
        ids = tok(text) + [sp.eot]
        return Sample(ids, [True] * (len(ids) - 1) + [False], "plain")
    # A hole [c, b) of at most max_middle_chars characters.
    c = rng.randrange(0, len(text))
    b = min(len(text), c + rng.randint(1, cfg.max_middle_chars))
    target = text[c:b]
    if r < cfg.p_plain + cfg.p_fim:
        prefix, suffix = tok(text[:c]), tok(text[b:])
        mid = tok(target) + [sp.eot]
        if rng.random() < 0.5:
            head, kind = [sp.pre, *prefix, sp.suf, *suffix, sp.mid], "fim-psm"
        else:
            head, kind = [sp.suf, *suffix, sp.pre, *prefix, sp.mid], "fim-spm"
        return Sample(head + mid, _mask(len(head), len(mid)), kind)
    # EFIM: the anchor a <= c; the text typed since it is the middle head.
    a = _line_start(text, c) if rng.random() < cfg.p_anchor_line_start else rng.randint(_line_start(text, c), c)
    head = [sp.pre, *tok(text[:a]), sp.suf, *tok(text[b:]), sp.mid, *tok(text[a:c])]
    mid = tok(target) + [sp.eot]
    return Sample(head + mid, _mask(len(head), len(mid)), "efim")


def _mask(n_head: int, n_target: int) -> list[bool]:
    """Position i is trained to predict token i + 1: exactly the target's tokens."""
    return [False] * (n_head - 1) + [True] * n_target + [False]
