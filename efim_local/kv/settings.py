"""The store's settings as the configuration gives them (the config stays a leaf: it knows no store)."""

from __future__ import annotations

from pathlib import Path

from ..config import Config, state_home
from .store import StoreConfig


def store_config(cfg: Config) -> StoreConfig | None:
    """The StoreConfig for ``cfg``, or None when the store is off."""
    if not cfg.store:
        return None
    return StoreConfig(Path(cfg.state_dir).expanduser() if cfg.state_dir else state_home() / "kv",
                       ram_mb=cfg.ram_mb, disk_mb=cfg.disk_mb, min_tokens=cfg.min_state_tokens,
                       shrink_to=cfg.sparse_shrink_to if cfg.sparse_budget > 0 else 0.0,
                       shrink_min_tokens=cfg.sparse_min_tokens)
