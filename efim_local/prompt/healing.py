"""Token healing for models that were not fragment-trained.

The text before the cursor usually ends inside a word, so its last token is a
piece no tokenizer would produce there. Healing backs that token off and
constrains the first generated token(s) to spell the removed text out again
and continue it: the model chooses the tokenization itself.
"""

from __future__ import annotations

import bisect

import numpy as np


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

    def allowed(self, r: bytes) -> np.ndarray:
        lo = bisect.bisect_left(self.keys, r)
        hi = bisect.bisect_left(self.keys, r + b"\xff" * 8)  # every key starting with r sorts before this
        prefixes = [i for k in range(1, len(r)) for i in self.by_piece.get(r[:k], ())]
        return np.concatenate([self.ids[lo:hi], np.array(prefixes, dtype=np.int64)])

    @staticmethod
    def should_heal(piece: bytes) -> bool:
        """Back off a token that ends in a word character (a word may go on)."""
        return bool(piece) and (piece[-1:].isalnum() or piece[-1:] == b"_")


def pick(logits: np.ndarray, allowed: np.ndarray) -> int:
    """Greedy choice among ``allowed`` token ids."""
    return int(allowed[np.argmax(logits[allowed])])
