"""Shape-true timing models: the writer's qwen2 GGUF loads in llama.cpp with the shape it states."""

from efim_local.engine import CompletionRequest, Engine
from efim_local.training import shape_models as sm

from ..helpers import small_config


def test_a_small_qwen2_shape_loads_and_completes(tmp_path):
    shape = sm.Shape("qwen2-mini", n_vocab=8192, n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256)
    path = sm.build(tmp_path / "mini.gguf", shape)
    # embeddings (tied output) + per layer: Q, K, V, O with biases, gate/up/down, two norms; final norm
    per_layer = 128 * 128 * 2 + 2 * 128 * 64 + 128 + 2 * 64 + 3 * 128 * 256 + 2 * 128
    assert sm.n_params(shape) == 8192 * 128 + 2 * per_layer + 128
    with Engine(small_config(), path) as e:
        assert e.model.n_vocab == 8192 and e.template.source == "gguf"  # padded vocabulary, FIM ids set
        assert e.model.meta("general.architecture") == "qwen2"
        doc = "def add(a, b):\n    return a + b\n"
        out = e.complete(CompletionRequest(doc, doc.index("return") + 7, path="mini.py", max_tokens=4))
        assert out.tokens.generated == 4 and out.tokens.prompt > 10


def test_the_published_shapes():
    q05, q15 = sm.SHAPES["qwen2.5-coder-0.5b"], sm.SHAPES["qwen2.5-coder-1.5b"]
    assert round(sm.n_params(q05) / 1e6) == 494 and round(sm.n_params(q15) / 1e6) == 1544
    assert (q05.head_dim, q15.head_dim) == (64, 128)  # the models' published parameter counts above
    q3 = sm.SHAPES["qwen2.5-coder-3b"]
    assert round(sm.n_params(q3) / 1e6) == 3086 and q3.head_dim == 128  # Qwen2.5-3B: 3.09B


def test_padding_tokens_stream_text(tmp_path):
    """A random model mostly generates padding tokens: each must show text, so that the first token
    streams something (the paced replay times the first text at the client)."""
    from efim_local.llama import Model

    shape = sm.Shape("qwen2-mini", n_vocab=8192, n_embd=64, n_layer=1, n_head=2, n_head_kv=1, n_ff=128)
    path = sm.build(tmp_path / "mini.gguf", shape)
    with Model(path) as m:
        pads = range(m.n_vocab - 100, m.n_vocab)
        assert all(m.piece(t) for t in pads)
        assert all(m.piece(t).startswith(b"pad") for t in pads)
        text = "def add(a, b):\n    return a + b\n"  # no merge makes a padding token
        assert max(m.tokenize(text)) < m.n_vocab - 4000 and m.detokenize(m.tokenize(text)) == text
    with Engine(small_config(), path) as e:
        seen = []
        out = e.complete(CompletionRequest(text, len(text), path="mini.py", max_tokens=8), on_text=seen.append)
        assert out.tokens.generated == 8 and len(seen) >= 7 and "".join(seen) == out.text
