"""Write llama-architecture GGUF files with the ``gguf`` package.

``arch="gemma3"`` writes a Gemma-3-style model instead (QK norms, post norms,
sliding-window attention), so tests can cover sliding-window KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bpe import EOT, FILE_SEP, FIM_MID, FIM_PAD, FIM_PRE, FIM_SUF, BpeVocab
from ..llama.meta import KEY_FRAGMENT, KEY_LAYOUT  # the keys the engine reads


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    arch: str = "llama"  # or "gemma3"
    n_swa: int = 0  # gemma3: sliding window (5 of every 6 layers use it)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def tensor_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """numpy shapes (rows = outputs) of every tensor, by GGUF name."""
    kv = cfg.n_head_kv * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.n_embd), "output_norm.weight": (cfg.n_embd,),
              "output.weight": (cfg.vocab_size, cfg.n_embd)}
    if cfg.arch == "gemma3":
        del shapes["output.weight"]  # tied to token_embd
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        if cfg.arch == "gemma3":
            shapes.update({b + "post_attention_norm.weight": (cfg.n_embd,), b + "post_ffw_norm.weight": (cfg.n_embd,),
                           b + "attn_q_norm.weight": (cfg.head_dim,), b + "attn_k_norm.weight": (cfg.head_dim,)})
        shapes.update({
            b + "attn_norm.weight": (cfg.n_embd,), b + "ffn_norm.weight": (cfg.n_embd,),
            b + "attn_q.weight": (cfg.n_embd, cfg.n_embd), b + "attn_k.weight": (kv, cfg.n_embd),
            b + "attn_v.weight": (kv, cfg.n_embd), b + "attn_output.weight": (cfg.n_embd, cfg.n_embd),
            b + "ffn_gate.weight": (cfg.n_ff, cfg.n_embd), b + "ffn_up.weight": (cfg.n_ff, cfg.n_embd),
            b + "ffn_down.weight": (cfg.n_embd, cfg.n_ff),
        })
    return shapes


def write(path: str | Path, cfg: LlamaConfig, tensors: dict[str, np.ndarray], vocab: BpeVocab,
          name: str = "efim-tiny", fragment_trained: bool = False, layout: str | None = None) -> Path:
    """Write a llama GGUF. Q/K rows must already be in llama.cpp's RoPE order (adjacent pairs)."""
    import gguf

    shapes = tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise ValueError(f"missing tensors: {', '.join(missing[:5])}")
    for k, shape in shapes.items():
        if tuple(tensors[k].shape) != shape:
            raise ValueError(f"tensor {k} has shape {tensors[k].shape}, expected {shape}")
    if len(vocab.tokens) != cfg.vocab_size:
        raise ValueError(f"vocabulary has {len(vocab.tokens)} tokens, config says {cfg.vocab_size}")

    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    w = gguf.GGUFWriter(str(tmp), cfg.arch)
    write_hparams(w, name, cfg)
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.arch == "gemma3":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        if cfg.n_swa:
            w.add_sliding_window(cfg.n_swa)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    write_vocab(w, vocab)
    w.add_bool(KEY_FRAGMENT, fragment_trained)
    if layout:
        w.add_string(KEY_LAYOUT, layout)

    for k in shapes:
        w.add_tensor(k, np.ascontiguousarray(tensors[k], dtype=np.float32))
    return finish(w, tmp, path)


def write_hparams(w, name: str, cfg) -> None:
    """The hyperparameters every decoder GGUF states (``cfg`` has n_ctx, n_embd, n_layer, n_ff,
    n_head, n_head_kv, rope_theta, norm_eps)."""
    w.add_name(name)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)


def finish(w, tmp: Path, path: Path) -> Path:
    """Write out a GGUFWriter's file at ``tmp``, then move it into place (never a half file)."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def write_vocab(w, vocab: BpeVocab, unused_from: int | None = None) -> None:
    """The tokenizer metadata of a byte-level BPE vocabulary, with its EOT and FIM token ids.
    Tokens from ``unused_from`` on are padding (type UNUSED)."""
    import gguf

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    types = [gguf.TokenType.CONTROL if t in vocab.special else gguf.TokenType.NORMAL for t in vocab.tokens]
    if unused_from is not None:
        types[unused_from:] = [gguf.TokenType.UNUSED] * (len(types) - unused_from)
    w.add_token_types(types)
    w.add_token_merges(vocab.merges)
    sp = vocab.special
    if EOT in sp:
        w.add_bos_token_id(sp[EOT])
        w.add_eos_token_id(sp[EOT])
        w.add_eot_token_id(sp[EOT])
    w.add_add_bos_token(False)
    for key, tok in ((gguf.Keys.Tokenizer.FIM_PRE_ID, FIM_PRE), (gguf.Keys.Tokenizer.FIM_SUF_ID, FIM_SUF),
                     (gguf.Keys.Tokenizer.FIM_MID_ID, FIM_MID), (gguf.Keys.Tokenizer.FIM_PAD_ID, FIM_PAD),
                     (gguf.Keys.Tokenizer.FIM_SEP_ID, FILE_SEP)):
        if tok in sp:
            w.add_uint32(key, sp[tok])
