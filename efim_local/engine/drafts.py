"""Speculative decoding with completion drafts, verified greedily in one batch (issue 24).

On a CPU, decoding is memory-bound: a batch of 9 tokens costs little more than one. Completion gives
drafts for free, with no draft model:

- the suffix: once the output starts to reproduce the text after the cursor, its next tokens are
  the suffix's (and the completion ends at the rejoin point: ``rejoin_text``, a stop rule of
  ``stream.py`` that holds for plain decoding too);
- n-grams: the longest n-gram (n = 3..1) ending the output that occurred before, in this output,
  the prompt (the file, the suffix first) or earlier completions, gives the tokens that followed it;
- the rest of a suggestion typed through or accepted: its tokens are the known greedy continuation
  (``GenSpec.known``, taken without decoding); the earlier completions hold the rest.

A draft of k tokens is verified by decoding the last token and the k drafts in one batch with
logits on every row: the greedy token after each row is its argmax, so the drafts are taken up to
the first that differs, plus that row's own token. At temperature 0 the output is token-identical
to plain decoding (only greedy runs draft). Rejected drafts' KV is cut.

The draft length adapts: it grows while whole drafts are taken and shrinks to what was taken; it is
at most ``max_draft`` with every core free, half that when other processes use some. When the tokens
taken per verified draft token fall low, drafting pauses for ``draft_pause`` tokens, then probes again.
(Those knobs are the engine's policy: ``policy.py``, the ``draft_`` fields.)
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from .policy import Policy

MIN_NGRAM, MAX_NGRAM = 1, 3
MIN_REJOIN = 6  # non-blank characters the rejoin text spans at least
SUFFIX_PEEK = 64  # suffix tokens read for the rejoin text


def _find(hay: np.ndarray, tail: np.ndarray) -> int:
    """The end of the last occurrence of ``tail`` in ``hay`` that some token follows; -1 if none."""
    n = len(tail)
    if len(hay) <= n:
        return -1
    hit = hay[:len(hay) - n] == tail[0]
    for k in range(1, n):
        hit &= hay[k:len(hay) - n + k] == tail[k]
    where = np.flatnonzero(hit)
    return int(where[-1]) + n if len(where) else -1


def find_suffix(prompt: np.ndarray, markers) -> np.ndarray:
    """The suffix tokens of a FIM or EFIM prompt (between its SUF marker and the next marker)."""
    if markers is None or not markers.suf:
        return prompt[:0]
    suf = np.asarray(markers.suf, dtype=np.int32)
    start = _find(prompt, suf)
    if start < 0:
        return prompt[:0]
    stop_marker = markers.pre if markers.order == "spm" else markers.mid
    if not stop_marker:
        return prompt[start:]
    rest = prompt[start:]
    at = _first(rest, stop_marker)
    return rest[:at] if at >= 0 else prompt[:0]


def _first(hay: np.ndarray, marker: Sequence[int]) -> int:
    """The start of the first occurrence of ``marker`` in ``hay``; -1 if none."""
    m = np.asarray(marker, dtype=np.int32)
    if not len(m):
        return -1
    hit = np.ones(max(0, len(hay) - len(m) + 1), dtype=bool)
    for k in range(len(m)):
        hit &= hay[k:len(hay) - len(m) + 1 + k] == m[k]
    where = np.flatnonzero(hit)
    return int(where[0]) if len(where) else -1


def find_before(prompt: np.ndarray, markers) -> np.ndarray:
    """The tokens of a FIM or EFIM prompt's text before the cursor: its prefix (up to the next
    marker), then the middle typed after the MID marker (EFIM; FIM has none there)."""
    if markers is None or not markers.pre:
        return prompt[:0]
    start = _find(prompt, np.asarray(markers.pre, dtype=np.int32))
    if start < 0:
        return prompt[:0]
    rest = prompt[start:]
    ends = [i for i in (_first(rest, markers.suf), _first(rest, markers.mid)) if i >= 0]
    before = rest[:min(ends)] if ends else rest
    mid = _first(rest, markers.mid)
    return np.concatenate([before, rest[mid + len(markers.mid):]]) if mid >= 0 else before


def rejoin_text(suffix_text: str) -> str:
    """Where an answer rejoins the document: the suffix's text through the end of its first line
    with content, and more lines until it spans ``MIN_REJOIN`` non-blank characters. Output that
    reproduces it has finished the middle: the answer stops before it. "" if the suffix ends first."""
    end = 0
    while True:
        nl = suffix_text.find("\n", end)
        if nl < 0:
            return ""
        end = nl + 1
        if len("".join(suffix_text[:end].split())) >= MIN_REJOIN:
            return suffix_text[:end]


class Drafter:
    """Draft tokens for one greedy generation, and the acceptance that steers them."""

    def __init__(self, prompt: np.ndarray, suffix: np.ndarray, history: Sequence[np.ndarray], cap: int,
                 stats: "DraftStats"):
        self.prompt, self.suffix, self.history = prompt, suffix, list(history)
        self.cap, self.stats, self.policy = cap, stats, stats.policy
        self.k = min(cap, max(2, stats.k))
        self.paused_until = self.policy.draft_pause if stats.costly() else 0
        self.plain_at = self.policy.draft_plain_every

    def propose(self, ids: list[int]) -> list[int]:
        """Up to ``k`` tokens likely to follow ``ids`` (the output so far); [] to decode plainly."""
        if len(ids) < self.paused_until or not ids:
            return []
        if self.stats.plain_s is None or len(ids) >= self.plain_at:  # a plain decode: the cost to beat
            self.plain_at = len(ids) + self.policy.draft_plain_every
            return []
        out = np.asarray(ids, dtype=np.int32)
        for n in range(min(MAX_NGRAM, len(ids)), MIN_NGRAM - 1, -1):
            tail = out[-n:]
            for hay in (self.suffix, out, self.prompt, *self.history):
                at = _find(hay, tail)
                if at >= 0:
                    return [int(t) for t in hay[at:at + self.k]]
        return []

    def taken(self, n_ids: int, drafted: int, accepted: int, seconds: float = 0.0) -> None:
        """Learn from a verification: ``accepted`` of ``drafted`` tokens were the greedy ones, and it
        took ``seconds``."""
        self.stats.note(drafted, accepted, seconds)
        self.k = min(self.cap, self.k + 2) if accepted == drafted else max(1, accepted + 1)
        self.stats.k = self.k
        low, pause = self.policy.draft_low_accept, self.policy.draft_pause
        if self.stats.rate < low:
            self.paused_until = n_ids + pause
            self.stats.rate = low  # the probe after the pause starts from the threshold
        elif self.stats.costly():
            self.paused_until = n_ids + pause


class DraftStats:
    """Acceptance and cost over all generations: the smoothed share of drafted tokens taken, and
    the smoothed time per token of plain decodes and of verified drafts. A model whose output layer
    dominates (a large vocabulary on a CPU: every verified row costs its logits) may decode no
    faster with drafts: they pause then, and probe again later."""

    def __init__(self, policy: Policy | None = None):
        self.policy = policy = Policy() if policy is None else policy
        self.drafted = self.accepted = self.verifications = 0
        self.rate = 0.5
        self.k = 4
        self.plain_s = self.draft_s = None  # smoothed seconds per token
        self.history: deque[np.ndarray] = deque(maxlen=policy.draft_history)

    def note(self, drafted: int, accepted: int, seconds: float = 0.0) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verifications += 1
        w = self.policy.draft_smooth
        self.rate = (1 - w) * self.rate + w * (accepted / max(1, drafted))
        if seconds > 0:
            self.draft_s = _ema(self.draft_s, seconds / (accepted + 1), w)

    def plain(self, seconds: float) -> None:
        """A plain decode took ``seconds`` (one token)."""
        self.plain_s = _ema(self.plain_s, seconds, self.policy.draft_smooth)

    def costly(self) -> bool:
        """Whether verified drafts have cost more per token than plain decodes lately."""
        return self.plain_s is not None and self.draft_s is not None and self.draft_s > self.plain_s

    def as_dict(self) -> dict:
        return {"verifications": self.verifications, "drafted": self.drafted, "accepted": self.accepted,
                "accept_rate": round(self.accepted / self.drafted, 3) if self.drafted else None,
                "ms_per_token": {"plain": _ms(self.plain_s), "drafts": _ms(self.draft_s)}}


def _ema(old: float | None, new: float, w: float) -> float:
    return new if old is None else (1 - w) * old + w * new


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 2)


def verify(dec, slot, prompt: np.ndarray, ids: list[int], draft: list[int]) -> list[int]:
    """Decode what the slot lacks of ``prompt`` + ``ids`` and ``draft`` in one batch; the greedy
    tokens that follow ``ids``: the drafts taken, then the first token that differs from its draft
    (or follows them all). The KV keeps ``prompt`` + ``ids`` + the drafts taken."""
    seq, have = dec.held(slot, prompt, ids)
    n = len(seq)
    cap = dec.batch.capacity
    if n - have + len(draft) > cap:  # a long catch-up (the KV was lost): the plain way
        draft = draft[:max(0, cap - (n - have))]
        if not draft:
            return [int(np.argmax(dec.ctx.logits(dec.logits_after(slot, prompt, ids))))]
    b = dec.batch
    b.clear()
    b.extend(seq[have:n - 1], have, slot.seq)
    rows = [b.add(int(seq[n - 1]), n - 1, slot.seq, True)]
    rows += [b.add(t, n + i, slot.seq, True) for i, t in enumerate(draft)]
    dec.decode(slot)
    out: list[int] = []
    for i, row in enumerate(rows):
        tok = dec.ctx.argmax(row)
        out.append(tok)
        if i >= len(draft) or tok != draft[i]:
            break
    taken = len(out) - 1  # drafts whose KV is right
    keep = n + taken
    if not dec.ctx.seq_rm(slot.seq, keep, -1):
        dec.ctx.seq_rm(slot.seq, 0, -1)
        slot.tokens = seq[:0]
    else:
        slot.tokens = np.concatenate([seq, np.asarray(draft[:taken], dtype=np.int32)])
    return out
