"""Random-weight GGUFs with the exact shapes of real code models: their text is noise, their
timings are real.

A shape is everything that costs time in llama.cpp: the architecture (``qwen2``: QKV biases,
tied output), layers, widths, heads and KV heads, the FFN, the full vocabulary (the output
projection over 151,936 tokens is a large part of each decode), and Q8_0 weights. The vocabulary
is this project's small BPE (trained on the standard library, with FIM tokens) padded with
tokens up to the real size, so prompts tokenize like code and every logit row is full size. The
padding tokens are ordinary tokens with printable text of their own (``pad123_``), which no merge
makes, so they never come out of tokenizing but stream text when generated: a random model picks
them most of the time, and an editor (or the paced replay) must see text for every token.
Benchmarks use these models; unit tests do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import bpe
from .corpus import read_texts, stdlib_files
from .gguf_llama import finish, write_hparams, write_vocab


@dataclass(frozen=True)
class Shape:
    name: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 32768
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# From the models' published config.json files (Qwen/Qwen2.5-Coder-*-Instruct and base alike).
SHAPES = {
    "qwen2.5-coder-0.5b": Shape("qwen2.5-coder-0.5b", 151936, 896, 24, 14, 2, 4864),
    "qwen2.5-coder-1.5b": Shape("qwen2.5-coder-1.5b", 151936, 1536, 28, 12, 2, 8960),
    "qwen2.5-coder-3b": Shape("qwen2.5-coder-3b", 151936, 2048, 36, 16, 2, 11008),
}


def tensor_shapes(s: Shape) -> dict[str, tuple[int, ...]]:
    """numpy shapes (rows = outputs) by GGUF tensor name; the output layer is tied to token_embd."""
    kv = s.n_head_kv * s.head_dim
    out = {"token_embd.weight": (s.n_vocab, s.n_embd), "output_norm.weight": (s.n_embd,)}
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out.update({
            b + "attn_norm.weight": (s.n_embd,), b + "ffn_norm.weight": (s.n_embd,),
            b + "attn_q.weight": (s.n_embd, s.n_embd), b + "attn_q.bias": (s.n_embd,),
            b + "attn_k.weight": (kv, s.n_embd), b + "attn_k.bias": (kv,),
            b + "attn_v.weight": (kv, s.n_embd), b + "attn_v.bias": (kv,),
            b + "attn_output.weight": (s.n_embd, s.n_embd),
            b + "ffn_gate.weight": (s.n_ff, s.n_embd), b + "ffn_up.weight": (s.n_ff, s.n_embd),
            b + "ffn_down.weight": (s.n_embd, s.n_ff),
        })
    return out


def n_params(s: Shape) -> int:
    return sum(int(np.prod(v)) for v in tensor_shapes(s).values())


def padding(n: int, taken: set[str]) -> list[str]:
    """``n`` printable token texts, none in ``taken`` (ASCII letters, digits and ``_`` are their own
    byte-level BPE text)."""
    out = [f"pad{i}_" for i in range(n)]
    if taken.intersection(out):
        raise ValueError("padding token texts collide with the vocabulary")
    return out


def build(path: str | Path, shape: Shape, seed: int = 0, progress=None) -> Path:
    """Write ``shape`` as a Q8_0 GGUF at ``path`` (2-D weights Q8_0, norms and biases f32).

    ``progress(n)`` is called once per tensor written (for a progress bar)."""
    import gguf

    tok = bpe.train(read_texts(stdlib_files()), 4096, bpe.SPECIALS)
    vocab = bpe.to_vocab(tok)
    pad = shape.n_vocab - len(vocab.tokens)
    if pad < 0:
        raise ValueError(f"the BPE vocabulary ({len(vocab.tokens)}) is larger than the shape's")
    vocab = bpe.BpeVocab(vocab.tokens + padding(pad, set(vocab.tokens)), vocab.merges, vocab.special, vocab.pre)
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    write_hparams(w, f"{shape.name} (random weights, for timing)", shape)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    write_vocab(w, vocab)
    rng = np.random.default_rng(seed)
    for name, shp in tensor_shapes(shape).items():
        if name.endswith("norm.weight"):
            w.add_tensor(name, np.ones(shp, np.float32))
        elif len(shp) == 1:
            w.add_tensor(name, rng.normal(0, 0.02, shp).astype(np.float32))
        else:
            std = 1.0 / np.sqrt(shp[1])  # keeps activations bounded through the layers
            data = rng.standard_normal(shp, dtype=np.float32) * np.float32(std)
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        if progress:
            progress(1)
    return finish(w, tmp, path)
