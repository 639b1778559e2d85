"""efim_local/ggufmeta.py against the gguf package's own reader, on a GGUF written by its writer."""

from __future__ import annotations

import pytest

from efim_local import ggufmeta
from efim_local.errors import ModelError


@pytest.fixture
def small_gguf(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tïny")
    w.add_uint32("tokenizer.ggml.fim_pre_token_id", 7)
    w.add_bool("efim.fragment", True)
    w.add_float32("x.scale", 0.5)
    w.add_token_list(["a", "<|fim_prefix|>", "<|fim_suffix|>", "é" * 40])
    w.add_array("x.ints", [1, 2, 3])
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_values_and_tokens_match_the_gguf_reader(small_gguf):
    import gguf

    ref = gguf.GGUFReader(str(small_gguf), "r")
    meta = ggufmeta.read(small_gguf)
    for key in ("general.architecture", "general.name", "tokenizer.ggml.fim_pre_token_id", "efim.fragment",
                "x.scale"):
        assert meta.get(key) == ref.fields[key].contents(), key
    assert meta.has_token("tokenizer.ggml.tokens", "<|fim_prefix|>") and meta.has_token("tokenizer.ggml.tokens",
                                                                                         "é" * 40)
    assert not meta.has_token("tokenizer.ggml.tokens", "<|fim_middle|>")
    assert not meta.has_token("x.ints", "a") and meta.arrays["x.ints"][:2] == (5, 3)  # int32 array


def test_a_truncated_or_foreign_file_is_a_model_error(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    for name, body in (("cut.gguf", data[:60]), ("empty.gguf", b""), ("text.gguf", b"GGUF not really\n")):
        p = tmp_path / name
        p.write_bytes(body)
        with pytest.raises(ModelError):
            ggufmeta.read(p)
