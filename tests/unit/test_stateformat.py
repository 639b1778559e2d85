"""The KV state file format and the llama.cpp state blob parser, on synthetic bytes (no model)."""

import os

import numpy as np
import pytest

from efim_local.kv import kvblob, stateformat
from efim_local.kv.stateformat import StateFileError


def test_state_file_roundtrip_and_faults(tmp_path):
    toks = np.arange(100, dtype=np.int32)
    payload = os.urandom(5000)
    p = tmp_path / "s.kv"
    stateformat.write(p, toks, payload, b"m" * 32, b"l" * 32, {"a": 1})
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    head, t, pl = stateformat.read(p, b"m" * 32, b"l" * 32)
    assert (t == toks).all() and pl == payload and head.params == {"a": 1}

    def expect(reason, data=None, **kw):
        q = tmp_path / "q.kv"
        q.write_bytes(data if data is not None else p.read_bytes())
        with pytest.raises(StateFileError) as e:
            stateformat.read(q, kw.get("model", b"m" * 32), kw.get("layout", b"l" * 32))
        assert e.value.reason == reason

    raw = p.read_bytes()
    expect("corrupt", raw[:-10])  # truncated
    expect("corrupt", raw[:50])
    flipped = bytearray(raw)
    flipped[len(raw) - 100] ^= 0x01
    expect("corrupt", bytes(flipped))  # bit flip in the payload
    flipped = bytearray(raw)
    flipped[12] ^= 0xFF
    expect("corrupt", bytes(flipped))  # token count no longer matches the size
    expect("model_changed", model=b"x" * 32)
    expect("layout_changed", layout=b"x" * 32)
    old = bytearray(raw)
    old[8] = 0
    expect("old_format", bytes(old))


def test_blob_rejects_garbage():
    for bad in (b"", b"\x00" * 7, os.urandom(64), kvblob._PREFIX.pack(kvblob.IO_MAGIC, 0) + b"\xff" * 12):
        with pytest.raises(kvblob.BlobError):
            kvblob.parse(bad)
