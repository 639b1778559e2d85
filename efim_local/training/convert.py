"""Convert checkpoints to GGUF: our training checkpoints and Hugging Face llama-family directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import UsageError
from . import bpe, gguf_llama
from .gguf_llama import LlamaConfig

SUPPORTED_HF = ("LlamaForCausalLM",)  # RMSNorm + RoPE + SwiGLU, no biases


class ConvertError(UsageError):
    pass


def save_checkpoint(directory: Path, cfg: LlamaConfig, tensors: dict[str, np.ndarray], tokenizer_json: str,
                    meta: dict) -> None:
    """A training checkpoint: safetensors weights (GGUF names), config and tokenizer. No pickle."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"efim": cfg.__dict__, **meta}, indent=2))
    (directory / "tokenizer.json").write_text(tokenizer_json)


def from_checkpoint(directory: str | Path, out: str | Path, layout: str = "efim") -> Path:
    """GGUF from a checkpoint written by save_checkpoint()."""
    from safetensors.numpy import load_file

    d = Path(directory)
    conf = json.loads((d / "config.json").read_text())
    cfg = LlamaConfig(**conf["efim"])
    vocab = bpe.to_vocab((d / "tokenizer.json").read_text())
    tensors = load_file(str(d / "model.safetensors"))
    frag = bool(conf.get("fragment_rate", 0) > 0)
    return gguf_llama.write(out, cfg, tensors, vocab, name=conf.get("name", "efim"), fragment_trained=frag,
                            layout=layout if frag else None)


def _permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotates halves; llama.cpp's llama RoPE rotates adjacent pairs: reorder the rows."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def from_hf(directory: str | Path, out: str | Path) -> Path:
    """GGUF from a Hugging Face llama-family directory (config.json, *.safetensors, tokenizer.json)."""
    from safetensors.numpy import load_file

    d = Path(directory)
    try:
        conf = json.loads((d / "config.json").read_text())
    except FileNotFoundError:
        raise ConvertError(f"{d}: no config.json") from None
    archs = conf.get("architectures") or [conf.get("model_type", "?")]
    if archs[0] not in SUPPORTED_HF:
        raise ConvertError(f"unsupported architecture {archs[0]!r}; supported: {', '.join(SUPPORTED_HF)}")
    if conf.get("attention_bias") or conf.get("mlp_bias"):
        raise ConvertError("llama checkpoints with biases are not supported")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{d}: no .safetensors files")
    hf: dict[str, np.ndarray] = {}
    for f in files:
        hf.update(load_file(str(f)))
    n_head = conf["num_attention_heads"]
    n_kv = conf.get("num_key_value_heads", n_head)
    cfg = LlamaConfig(vocab_size=conf["vocab_size"], n_embd=conf["hidden_size"], n_layer=conf["num_hidden_layers"],
                      n_head=n_head, n_head_kv=n_kv, n_ff=conf["intermediate_size"],
                      n_ctx=conf.get("max_position_embeddings", 4096), rope_theta=conf.get("rope_theta", 10000.0),
                      norm_eps=conf.get("rms_norm_eps", 1e-5))
    g = lambda k: hf[k].astype(np.float32)
    t = {"token_embd.weight": g("model.embed_tokens.weight"), "output_norm.weight": g("model.norm.weight"),
         "output.weight": g("lm_head.weight") if "lm_head.weight" in hf else g("model.embed_tokens.weight")}
    for i in range(cfg.n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t.update({
            b + "attn_norm.weight": g(p + "input_layernorm.weight"),
            b + "attn_q.weight": _permute_qk(g(p + "self_attn.q_proj.weight"), n_head),
            b + "attn_k.weight": _permute_qk(g(p + "self_attn.k_proj.weight"), n_kv),
            b + "attn_v.weight": g(p + "self_attn.v_proj.weight"),
            b + "attn_output.weight": g(p + "self_attn.o_proj.weight"),
            b + "ffn_norm.weight": g(p + "post_attention_layernorm.weight"),
            b + "ffn_gate.weight": g(p + "mlp.gate_proj.weight"),
            b + "ffn_up.weight": g(p + "mlp.up_proj.weight"),
            b + "ffn_down.weight": g(p + "mlp.down_proj.weight"),
        })
    try:
        vocab = bpe.to_vocab((d / "tokenizer.json").read_text())
    except FileNotFoundError:
        raise ConvertError(f"{d}: no tokenizer.json") from None
    if len(vocab.tokens) < cfg.vocab_size:  # padded embedding rows
        vocab = bpe.BpeVocab(vocab.tokens + [f"<|pad{i}|>" for i in range(cfg.vocab_size - len(vocab.tokens))],
                             vocab.merges, vocab.special, vocab.pre)
    return gguf_llama.write(out, cfg, t, vocab, name=conf.get("_name_or_path", d.name))
