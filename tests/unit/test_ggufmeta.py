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


# -- issue 38 item 7: the whole header, as llama.cpp checks it ----------------------------------------
def _patched(small_gguf, tmp_path, name, fn):
    p = tmp_path / name
    p.write_bytes(fn(small_gguf.read_bytes()))
    return p


def _tensor(data: bytes, n_dims=1, dim=4, kind=0, offset=0) -> bytes:
    """``data`` with tensor t's record (1 dimension of 4, F32, offset 0) replaced."""
    import struct

    old = struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 4, 0, 0)
    assert data.count(old) == 1
    new = struct.pack("<Q", 1) + b"t" + struct.pack("<I", n_dims) + struct.pack(f"<{n_dims}Q", *[dim] * n_dims) + \
        struct.pack("<IQ", kind, offset)
    return data.replace(old, new)


@pytest.mark.parametrize("name, fn, why", [
    ("v99", lambda d: d[:4] + (99).to_bytes(4, "little") + d[8:], "GGUF version 99; llama.cpp reads versions 2 and 3"),
    ("v1", lambda d: d[:4] + (1).to_bytes(4, "little") + d[8:], "GGUF version 1"),
    ("tensors", lambda d: d[:8] + (2**64 - 1).to_bytes(8, "little") + d[16:], "18446744073709551615 tensors cannot fit"),
    ("keys", lambda d: d[:16] + (2**40).to_bytes(8, "little") + d[24:], "metadata keys cannot fit"),
    ("cut", lambda d: d[:-20], "past the end of the file"),  # (16 bytes of data, then padding to 32)
    ("type", lambda d: _tensor(d, kind=99), "unknown ggml type 99"),
    ("offset", lambda d: _tensor(d, offset=32), "data at offset 32, where 0 was due"),
    ("huge", lambda d: _tensor(d, dim=2**40), "past the end of the file"),
    ("dims", lambda d: _tensor(d, n_dims=5, dim=1), "5 dimensions"),
    ("blocks", lambda d: _tensor(d, kind=2), "not whole blocks of 32"),  # Q4_0
])
def test_a_header_llama_cpp_would_refuse_is_a_model_error(small_gguf, tmp_path, name, fn, why):
    """Each of these loaded as metadata before, and llama.cpp refused the file only when `use` had
    written it into config.toml."""
    with pytest.raises(ModelError) as e:
        ggufmeta.read(_patched(small_gguf, tmp_path, f"{name}.gguf", fn))
    assert why in str(e.value) and "\n" not in str(e.value)


def test_the_tensors_are_where_the_gguf_reader_says(small_gguf):
    import gguf

    ref = gguf.GGUFReader(str(small_gguf), "r").tensors[0]
    kind, shape, start, end = ggufmeta.read(small_gguf).tensors["t"]
    assert (kind, shape, start, end - start) == (int(ref.tensor_type), (4,), ref.data_offset, ref.n_bytes)
