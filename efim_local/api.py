"""High-level entry points for tools that embed efim-local."""

from __future__ import annotations

from .config import Config, load
from .engine import Completion, CompletionRequest, Engine
from .engine.models import resolve_model
from .kv.settings import store_config

__all__ = ["open_engine", "Engine", "Completion", "CompletionRequest", "Config"]


def open_engine(cfg: Config | None = None) -> Engine:
    """Load the configured (or default) model and return an Engine; use it as a context manager."""
    cfg = cfg or load()
    if cfg.backend:  # replicas run the prompts (docs/team.md)
        from .engine.remote import open_remote

        return open_remote(cfg, resolve_model(cfg), store=store_config(cfg) if cfg.local_fallback else None)
    return Engine(cfg, resolve_model(cfg), store=store_config(cfg))
