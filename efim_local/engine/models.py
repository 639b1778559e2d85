"""Which model to load, and what its GGUF metadata says about how to prompt it."""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..errors import ModelError
from ..llama.meta import KEY_FRAGMENT, KEY_LAYOUT

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "efim-default.gguf"


def default_model() -> Path:
    """The bundled fragment-trained model."""
    if not BUNDLED.exists():
        raise ModelError(f"the bundled model is missing ({BUNDLED}); reinstall efim-local or pass --model")
    return BUNDLED


def resolve_model(cfg: Config) -> Path:
    """The model a configuration names, or the bundled default."""
    return Path(cfg.model).expanduser() if cfg.model else default_model()


def describe(model) -> str:
    """One line on a model: its name, architecture, parameter count and weight type. llama.cpp's own
    description rounds the count to a size class (Qwen2.5-Coder-0.5B is "qwen2 1B"): the GGUF's
    ``general.size_label`` says what its makers call it."""
    arch, _, rest = model.description().partition(" ")
    size, _, kind = rest.partition(" ")
    size = model.meta("general.size_label") or (size if "?" not in size else count_label(model.n_params))
    name = model.meta("general.name")
    return f"{name + ': ' if name else ''}{arch}, {size} parameters, {kind}".rstrip(", ")


def count_label(n: int) -> str:
    """A parameter count as its makers write it: 2.4M, 494M, 1.5B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2g}{unit}" if n < 10 * scale else f"{n / scale:.0f}{unit}"
    return str(n)


# The defaults come from the sub-token evaluation (efim bench subtoken, docs/models.md,
# "Choosing the layout"): every kind of model continues a partial word best with EFIM (the typed text
# after the middle marker) and token healing, and EFIM never recomputes the suffix while one types.
KIND_FRAGMENT = "fragment-trained"
KIND_FIM = "FIM tokens, not fragment-trained"
KIND_TEXT = "text FIM markers"


def model_kind(meta, text_markers: bool = False) -> str:
    """Which of the three measured kinds a model is: fragment-trained (GGUF metadata), a FIM model
    without fragment training, or a model prompted with text markers."""
    if (meta(KEY_FRAGMENT) or "").lower() == "true":
        return KIND_FRAGMENT
    return KIND_TEXT if text_markers else KIND_FIM


def choose_layout(meta, config_layout: str | None, text_markers: bool = False) -> tuple[str, str]:
    """(layout, reason) for a model whose metadata reader is ``meta(key)``: EFIM for every kind of model
    (measured: docs/models.md), the layout a fragment-trained model was trained for if its metadata
    names one, unless the configuration says otherwise. The reason is one line for status and the log."""
    if config_layout:
        return config_layout, f"configured layout = \"{config_layout}\""
    kind = model_kind(meta, text_markers)
    if kind == KIND_FRAGMENT:
        trained = meta(KEY_LAYOUT)
        why = f"model metadata {KEY_FRAGMENT}=true" + (f", {KEY_LAYOUT}={trained}" if trained else "")
        return trained or "efim", why
    return "efim", (f"{kind}: EFIM with token healing answers as well as FIM or better, and keeps the suffix cached "
                    "(docs/models.md)")


def choose_heal(meta, text_markers: bool = False, config_heal: bool | None = None) -> tuple[bool, str]:
    """(heal, reason): token healing by default for every kind of model, unless the configuration says
    otherwise; a request may still choose."""
    if config_heal is not None:
        return config_heal, f"configured heal = {str(config_heal).lower()}"
    kind = model_kind(meta, text_markers)
    what = "a word's last token" if kind == KIND_FRAGMENT else "every typed token that could merge with what follows"
    return True, f"{kind}: healing re-chooses {what} (docs/models.md)"


def remote_heal(pool, meta, text_markers: bool = False, config_heal: bool | None = None) -> tuple[bool, str]:
    """Healing with replicas (``pool``, a backend.Pool): as in-process on llama-server (a grammar picks
    the healed token), off on OpenAI-compatible servers (no grammar over llama.cpp's tokens there)."""
    if not pool.heals:
        return False, "OpenAI-compatible backend: healing needs llama-server's grammar"
    return choose_heal(meta, text_markers, config_heal)
