"""Per-file KV states that survive: RAM and disk tiers, an SQLite index, longest-match restore."""

from .store import MISS_REASONS, Lookup, Match, StateStore, StoreConfig

__all__ = ["MISS_REASONS", "Lookup", "Match", "StateStore", "StoreConfig"]
