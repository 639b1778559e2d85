"""Token healing: the typed text's last tokens are backed off and generation spells them out again.

The text before the cursor was tokenized without what follows it, so its last tokens are often ones
no tokenizer would produce there: a partial word (``retur``), a space that belongs to the next word
(``= `` then `` len``), indentation the next line's first token would extend, an operator or a quote
that merges with what follows (``(`` into ``()``, ``"`` into ``\"\"\"``), a partial UTF-8 character.
A model never saw those boundaries in training, and its answer suffers (a second space, the rest of
a word skipped). Healing backs off every trailing token that could have merged with the text after
it (:func:`backoff`), and constrains the first generated tokens to spell the removed bytes out again
(:meth:`Healer.allowed`): the model chooses the tokenization itself.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

MAX_BACKOFF = 4  # tokens: a partial identifier spans 2-3 tokens; more costs a keystroke's time for little


class Healer:
    """Finds, fast, the tokens consistent with some removed text ``r``:
    those whose bytes start with ``r`` (one contiguous range of the sorted
    pieces) and those whose bytes are a proper prefix of ``r``."""

    def __init__(self, pieces: list[bytes]):
        order = sorted((p, i) for i, p in enumerate(pieces) if p)
        self.keys = [p for p, _ in order]
        self.ids = np.array([i for _, i in order], dtype=np.int64)
        self.by_piece: dict[bytes, list[int]] = {}
        for p, i in order:
            self.by_piece.setdefault(p, []).append(i)

    @classmethod
    def of_model(cls, model) -> "Healer":
        """The index of a model's vocabulary (it reads every token's bytes: build it once)."""
        return cls([model.piece(t) for t in range(model.n_vocab)])

    def allowed(self, r: bytes) -> np.ndarray:
        lo = bisect.bisect_left(self.keys, r)
        hi = bisect.bisect_left(self.keys, r + b"\xff" * 8)  # every key starting with r sorts before this
        prefixes = [i for k in range(1, len(r)) for i in self.by_piece.get(r[:k], ())]
        return np.concatenate([self.ids[lo:hi], np.array(prefixes, dtype=np.int64)])

    def extends(self, r: bytes) -> bool:
        """Whether some token starts with ``r`` and goes on: text ending in ``r`` may merge with
        what follows it into one token."""
        i = bisect.bisect_right(self.keys, r)  # the first key after r itself
        return i < len(self.keys) and self.keys[i].startswith(r)

    def backoff(self, pieces: Sequence[bytes], limit: int = MAX_BACKOFF, word_end: bool = False) -> int:
        """How many of the trailing ``pieces`` (the typed text's tokens) to back off: the most, up to
        ``limit``, whose joint text some token extends (each one more is still a token's start).
        ``word_end``: only a last token that ends in a word character (a fragment-trained model saw
        every other boundary in training: docs/models.md)."""
        if word_end:
            last = pieces[-1][-1:] if pieces else b""
            return int(last.isalnum() or last == b"_")
        k, r = 0, b""
        while k < min(limit, len(pieces)):
            joint = pieces[-1 - k] + r
            if not joint or not self.extends(joint):
                break
            k, r = k + 1, joint
        return k


def left_after(heal: bytes, piece: bytes) -> bytes:
    """What of the text ``heal`` is left to spell after a token ``piece`` chosen among
    ``Healer.allowed(heal)`` (it either spells all of it and more, or a prefix of it)."""
    return b"" if piece.startswith(heal) else heal[len(piece):]


def pick(logits: np.ndarray, allowed: np.ndarray) -> int:
    """Greedy choice among ``allowed`` token ids."""
    return int(allowed[np.argmax(logits[allowed])])
