"""A tiny random-weight llama GGUF that the project builds itself.

It has a real byte-level BPE vocabulary (trained on the Python standard
library) with FIM tokens, so the whole engine runs on real llama.cpp, but its
weights are random: completions are deterministic noise. Tests use it; the
trained default model comes from scripts/train.py.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

from . import bpe, gguf_llama
from .corpus import read_texts, stdlib_files
from .gguf_llama import LlamaConfig

TINY_VERSION = 1  # bump when the recipe changes


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    shapes = gguf_llama.tensor_shapes(cfg)
    head = "output.weight" if "output.weight" in shapes else "token_embd.weight"  # tied embeddings
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, np.float32)
        else:
            # A wide output layer keeps logit gaps far above float noise,
            # so greedy choices are stable under batching differences.
            std = 1.0 if name == head else 0.08
            out[name] = rng.normal(0, std, shape).astype(np.float32)
    return out


def build(path: str | Path, vocab_size: int = 1024, seed: int = 0, fim_tokens: bool = True,
          swa: int = 0, **shape) -> Path:
    """Build the tiny model at ``path`` (deterministic for a given Python stdlib).

    ``swa > 0`` builds a Gemma-3-style model with that sliding window instead; ``shape`` overrides
    LlamaConfig fields (``n_embd``, ``n_layer``, ...: a larger file for tests that need one).
    """
    tok = bpe.train(read_texts(stdlib_files()), vocab_size, bpe.SPECIALS if fim_tokens else (bpe.EOT,))
    vocab = bpe.to_vocab(tok)
    if swa:
        cfg = LlamaConfig(**{"vocab_size": len(vocab.tokens), "n_layer": 6, "arch": "gemma3", "n_swa": swa, **shape})
    else:
        cfg = LlamaConfig(vocab_size=len(vocab.tokens), **shape)
    return gguf_llama.write(path, cfg, random_weights(cfg, seed), vocab, name="efim-tiny-random")


def cached(cache_dir: str | Path) -> Path:
    """Path of the tiny model in ``cache_dir``, building it on first use."""
    key = hashlib.sha256(f"{TINY_VERSION}:{sysconfig.get_python_version()}".encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"efim-tiny-{key}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build(path)
    return path
