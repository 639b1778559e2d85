"""What the store's tiers share: a saved state (``Entry``), what every state of one store is for
(``Kind``), the eviction order (``value``), ``alive`` and the small interface a tier offers (``Tier``).

A tier holds states under an MB budget. It makes room before it takes a state, moving the least
valuable ones one tier down (RAM → disk) or out (disk → deleted). The index rows of its states say
which tier holds them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MB = 1 << 20


def value(last_used: float, hits: int, n_tokens: int) -> float:
    """Eviction order: older, less hit, shorter states go first."""
    return last_used + 300 * math.log2(1 + hits) + 60 * math.log2(1 + n_tokens / 1024)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Entry:
    """A saved state on its way through the tiers."""

    id: str
    tokens: np.ndarray
    payload: bytes  # normalized sequence state
    path: str
    content_hash: str
    created: float
    last_used: float
    hits: int = 0
    partial: bytes | None = None  # InfiniGen partial keys (npz), kept beside the state


@dataclass(frozen=True)
class Kind:
    """The model and KV layout every state of a store belongs to (written into state files)."""

    model: bytes  # model fingerprint
    layout: bytes  # layout key
    params: dict  # layout parameters

    @property
    def model_hex(self) -> str:
        return self.model.hex()

    @property
    def layout_hex(self) -> str:
        return self.layout.hex()

    def row(self, e: Entry, tier: str, size: int) -> dict:
        """The index row of ``e`` held by ``tier``."""
        return {"id": e.id, "path": e.path, "content_hash": e.content_hash, "model": self.model_hex,
                "layout": self.layout_hex, "n_tokens": len(e.tokens), "bytes": size, "tier": tier,
                "created": e.created, "last_used": e.last_used, "hits": e.hits,
                "owner": os.getpid() if tier == "ram" else 0, "kept": 1.0}


class Tier(Protocol):
    """One level of the store. Reads raise ``StateFileError`` or ``OSError`` for an unusable state."""

    name: str  # "ram" | "disk": the ``tier`` of its index rows
    budget: int  # bytes

    def tokens(self, state_id: str) -> np.ndarray:
        """The state's tokens (cheap: no payload is read)."""

    def read(self, state_id: str) -> tuple[np.ndarray, bytes]:
        """The state's tokens and normalized payload (counts as a use)."""

    def partial(self, state_id: str) -> bytes | None:
        """The state's InfiniGen partial keys, or None."""

    def add(self, e: Entry) -> None:
        """Hold ``e`` (and index it), after making room for it."""

    def make_room(self, size: int) -> None:
        """Move states out until ``size`` more bytes fit the budget."""

    def remove(self, state_id: str) -> None:
        """Forget the state's data (its index row is the caller's)."""

    def used(self) -> int:
        """Bytes held."""

    def clear(self) -> None:
        """Forget every state's data."""
