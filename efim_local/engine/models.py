"""Which model to load, and what its GGUF metadata says about how to prompt it."""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..errors import ModelError

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "efim-default.gguf"

# GGUF metadata keys this project writes into the models it trains (training/gguf_llama.py).
KEY_FRAGMENT = "efim.fragment_trained"  # "true": trained with fragment tokenization
KEY_LAYOUT = "efim.layout"  # the prompt layout the model was trained for


def default_model() -> Path:
    """The bundled fragment-trained model."""
    if not BUNDLED.exists():
        raise ModelError(f"the bundled model is missing ({BUNDLED}); reinstall efim-local or pass --model")
    return BUNDLED


def resolve_model(cfg: Config) -> Path:
    """The model a configuration names, or the bundled default."""
    return Path(cfg.model).expanduser() if cfg.model else default_model()


def choose_layout(meta, config_layout: str | None) -> tuple[str, str]:
    """(layout, reason) for a model whose metadata reader is ``meta(key)``: EFIM for fragment-trained
    models (they continue a partial word), FIM for others, unless the configuration says otherwise.
    The reason is one line for status output and the log."""
    fragment = (meta(KEY_FRAGMENT) or "").lower() == "true"
    if config_layout:
        return config_layout, f"configured layout = \"{config_layout}\""
    if fragment:
        trained = meta(KEY_LAYOUT)
        why = f"model metadata {KEY_FRAGMENT}=true" + (f", {KEY_LAYOUT}={trained}" if trained else "")
        return trained or "efim", why
    return "fim", f"model not fragment-trained (no {KEY_FRAGMENT}=true); set layout = \"efim\" to reuse the suffix"


def default_layout(meta, config_layout: str | None) -> tuple[str, bool]:
    """(layout, fragment_trained): see choose_layout."""
    return choose_layout(meta, config_layout)[0], (meta(KEY_FRAGMENT) or "").lower() == "true"
