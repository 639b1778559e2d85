"""The store's sparse bookkeeping: which cells sparse restores chose, per state, and whether a long
state is shrunk to its most-chosen cells under disk pressure (InfiniGen's pool) before eviction.

The shrinking itself (``SparseMode.shrink``) needs the model's skew; the store gets it as a plain
function when it is opened, so ``kv/`` never reaches up into the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# (payload, partial keys, times each position was selected, fraction to keep) -> (payload, partial) | None
ShrinkFn = Callable[[bytes, "bytes | None", "np.ndarray | None", float], "tuple[bytes, bytes | None] | None"]


@dataclass
class SparseBook:
    shrink_fn: ShrinkFn | None = None
    shrink_to: float = 0.0  # fraction of cells a shrunk state keeps; 0: never shrink
    min_tokens: int = 4096  # shorter states are evicted whole
    selected: dict = field(default_factory=dict)  # state id -> times selected, indexed by position

    def note(self, state_id: str, positions: np.ndarray) -> None:
        """Count which cells a sparse restore chose (in memory: no disk write on the request path)."""
        if len(positions) == 0:
            return
        c = self.selected.get(state_id, np.zeros(0, np.int32))
        top = int(positions.max()) + 1
        if len(c) < top:
            c = self.selected[state_id] = np.concatenate([c, np.zeros(top - len(c), np.int32)])
        c[positions] += 1

    def shrinks(self, n_tokens: int) -> bool:
        """Whether a state of ``n_tokens`` (with partial keys) is shrunk rather than evicted."""
        return bool(self.shrink_to) and self.shrink_fn is not None and n_tokens >= self.min_tokens

    def shrink(self, state_id: str, payload: bytes, partial: bytes | None):
        """The state with only its most-selected cells, as (payload, partial), or None."""
        return self.shrink_fn(payload, partial, self.selected.get(state_id), self.shrink_to)
