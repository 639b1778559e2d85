"""GGUF conversion round trip: llama.cpp's logits match the PyTorch model's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from efim_local.training import bpe, gguf_llama  # noqa: E402
from efim_local.llama import Batch, Context, ContextParams, Model  # noqa: E402
from efim_local.training.gguf_llama import LlamaConfig  # noqa: E402
from efim_local.training.corpus import read_texts, stdlib_files  # noqa: E402
from efim_local.training.torch_llama import Llama  # noqa: E402


def random_model(cfg: LlamaConfig, seed: int) -> Llama:
    torch.manual_seed(seed)
    m = Llama(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)  # larger than init, so the logits are far from uniform
    return m


def max_rel_error(path, m: Llama, text: str) -> float:
    """llama.cpp's logits for every token of ``text`` against PyTorch's."""
    with Model(path) as model, Context(model, ContextParams(n_ctx_seq=256, n_slots=1, type_k="f32", type_v="f32")) as ctx, \
            Batch(256) as batch:
        ids = model.tokenize(text)
        for i, t in enumerate(ids):
            batch.add(t, i, 0, logits=True)
        ctx.decode(batch)
        got = np.stack([ctx.logits(i) for i in range(len(ids))])
    with torch.no_grad():
        want = m(torch.tensor([ids])).numpy()[0]
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_gguf_logits_match_pytorch(tmp_path):
    vocab = bpe.to_vocab(bpe.train(read_texts(stdlib_files(300_000)), 512))
    cfg = LlamaConfig(vocab_size=len(vocab.tokens), n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=160)
    m = random_model(cfg, 0)
    path = gguf_llama.write(tmp_path / "rt.gguf", cfg, m.gguf_tensors(), vocab, name="roundtrip",
                            fragment_trained=True, layout="efim")
    assert max_rel_error(path, m, "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n") <= 1e-3
    with Model(path) as model:
        assert model.meta("efim.fragment_trained") == "true" and model.meta("efim.layout") == "efim"


def test_hf_directory_conversion(tmp_path):
    from safetensors.numpy import save_file

    from efim_local.training.convert import ConvertError, from_hf

    tok = bpe.train(read_texts(stdlib_files(200_000)), 400)
    vocab = bpe.to_vocab(tok)
    cfg = LlamaConfig(vocab_size=len(vocab.tokens), n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96)
    m = random_model(cfg, 1)
    g = m.gguf_tensors()

    def to_hf_rows(w, n_head):  # adjacent-pair RoPE rows -> HF's half-split rows
        rows, cols = w.shape
        return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)

    hf = {"model.embed_tokens.weight": g["token_embd.weight"], "model.norm.weight": g["output_norm.weight"],
          "lm_head.weight": g["output.weight"]}
    for i in range(cfg.n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        hf.update({p + "input_layernorm.weight": g[b + "attn_norm.weight"],
                   p + "self_attn.q_proj.weight": to_hf_rows(g[b + "attn_q.weight"], cfg.n_head),
                   p + "self_attn.k_proj.weight": to_hf_rows(g[b + "attn_k.weight"], cfg.n_head_kv),
                   p + "self_attn.v_proj.weight": g[b + "attn_v.weight"],
                   p + "self_attn.o_proj.weight": g[b + "attn_output.weight"],
                   p + "post_attention_layernorm.weight": g[b + "ffn_norm.weight"],
                   p + "mlp.gate_proj.weight": g[b + "ffn_gate.weight"],
                   p + "mlp.up_proj.weight": g[b + "ffn_up.weight"],
                   p + "mlp.down_proj.weight": g[b + "ffn_down.weight"]})
    d = tmp_path / "hf"
    d.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in hf.items()}, str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text(tok.to_str())
    conf = {"architectures": ["LlamaForCausalLM"], "vocab_size": cfg.vocab_size, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
    import json

    (d / "config.json").write_text(json.dumps(conf))
    assert max_rel_error(from_hf(d, tmp_path / "hf.gguf"), m, "class Point:\n    x: int\n") <= 1e-3

    (d / "config.json").write_text(json.dumps(dict(conf, architectures=["MistralForCausalLM"])))
    with pytest.raises(ConvertError, match="unsupported architecture 'MistralForCausalLM'"):
        from_hf(d, tmp_path / "x.gguf")
