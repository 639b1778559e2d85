"""Per-file KV states that survive: RAM and disk tiers, an SQLite index, longest-match restore."""

from .events import MISS_REASONS, Hit, Miss
from .store import Lookup, Match, StateStore, StoreConfig

__all__ = ["MISS_REASONS", "Hit", "Miss", "Lookup", "Match", "StateStore", "StoreConfig"]
