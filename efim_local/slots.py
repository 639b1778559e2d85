"""Slots: the llama context's sequences, and the tokens whose KV each holds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

EMPTY = np.zeros(0, np.int32)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int arrays (vectorised, no Python loop)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass
class Slot:
    seq: int
    tokens: np.ndarray = field(default_factory=lambda: EMPTY)  # KV held for positions 0..len-1
    last_used: float = 0.0
    path: str | None = None  # the document it last served

    def touch(self, path: str | None) -> None:
        self.last_used = time.monotonic()
        self.path = path


class SlotManager:
    """Chooses the slot with the longest common token prefix, then the least recently used."""

    def __init__(self, n_slots: int):
        self.slots = [Slot(seq=i) for i in range(n_slots)]

    def pick(self, tokens: np.ndarray, exclude: set[int] = frozenset()) -> tuple[Slot, int]:
        best, best_n = None, -1
        for slot in self.slots:  # a handful of slots, each compared with numpy
            if slot.seq in exclude:
                continue
            n = common_prefix(slot.tokens, tokens)
            if n > best_n or (n == best_n and slot.last_used < best.last_used):
                best, best_n = slot, n
        if best is None:
            raise RuntimeError("no free slot")
        return best, best_n

    def lru(self, exclude: set[int]) -> Slot | None:
        cands = [s for s in self.slots if s.seq not in exclude and len(s.tokens)]
        return min(cands, key=lambda s: s.last_used) if cands else None
