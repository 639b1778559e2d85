"""The RAM tier: normalized states in host memory, under ``ram_mb``. Making room moves the least
valuable states one tier down (to the tier given at construction: the disk)."""

from __future__ import annotations

import os
import time
from typing import Iterator

import numpy as np

from .index import Index
from .tier import Entry, Kind, Tier, alive, value


class RamTier:
    name = "ram"

    def __init__(self, budget: float, index: Index, kind: Kind, below: Tier):
        self.budget, self.index, self.kind, self.below = budget, index, kind, below
        self.entries: dict[str, Entry] = {}

    def __contains__(self, state_id: str) -> bool:
        return state_id in self.entries

    def tokens(self, state_id: str) -> np.ndarray:
        return self.entries[state_id].tokens

    def read(self, state_id: str) -> tuple[np.ndarray, bytes]:
        e = self.entries[state_id]
        e.last_used, e.hits = time.time(), e.hits + 1
        return e.tokens, e.payload

    def partial(self, state_id: str) -> bytes | None:
        return self.entries[state_id].partial

    @staticmethod
    def size(e: Entry) -> int:
        return len(e.payload) + e.tokens.nbytes

    def add(self, e: Entry) -> None:
        size = self.size(e)
        self.make_room(size)
        self.entries[e.id] = e
        self.index.add(self.kind.row(e, "ram", size), e.tokens)

    def make_room(self, size: int) -> None:
        used = self.used()
        for e in sorted(self.entries.values(), key=lambda e: value(e.last_used, e.hits, len(e.tokens))):
            if used + size <= self.budget:
                break
            used -= self.size(e)
            del self.entries[e.id]
            self.below.add(e)  # one tier down

    def remove(self, state_id: str) -> None:
        self.entries.pop(state_id, None)

    def used(self) -> int:
        return sum(self.size(e) for e in self.entries.values())

    def clear(self) -> None:
        self.entries.clear()

    def drain(self) -> Iterator[Entry]:
        """Every state, each forgotten as it is handed out (to be written one tier down)."""
        for e in list(self.entries.values()):
            del self.entries[e.id]
            yield e

    def drop_stale_rows(self) -> int:
        """Forget RAM-tier rows of processes that are gone (or of this one, but not in RAM)."""
        n = 0
        for row in self.index.rows("ram"):
            mine = row["owner"] == os.getpid()
            if (mine and row["id"] not in self.entries) or (not mine and not alive(row["owner"])):
                self.index.remove(row["id"])
                n += 1
        return n
