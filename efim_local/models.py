"""Where the model comes from when none is given."""

from __future__ import annotations

from pathlib import Path

from .config import Config, cache_home

BUNDLED = Path(__file__).parent / "data" / "efim-default.gguf"


def default_model() -> Path:
    """The bundled fragment-trained model if present, else the tiny random model (built once)."""
    if BUNDLED.exists():
        return BUNDLED
    from . import tinymodel

    return tinymodel.cached(cache_home() / "models")


def resolve_model(cfg: Config) -> Path:
    return Path(cfg.model).expanduser() if cfg.model else default_model()
