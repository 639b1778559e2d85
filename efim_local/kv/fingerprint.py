"""What makes a saved state usable: the same model, the same KV layout."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

HEAD_BYTES = 8 << 20  # covers the GGUF header, metadata and tensor info of typical models
TAIL_BYTES = 1 << 20


@lru_cache(maxsize=16)
def _fingerprint(path: str, size: int, mtime_ns: int) -> bytes:
    h = hashlib.sha256(b"efim-model-v1")
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
        if size > HEAD_BYTES:
            f.seek(max(HEAD_BYTES, size - TAIL_BYTES))
            h.update(f.read(TAIL_BYTES))
    return h.digest()


def model_fingerprint(path: str | Path) -> bytes:
    """sha256 over the file size, its first 8 MiB (header, metadata, tensor info) and its last MiB."""
    st = os.stat(path)
    return _fingerprint(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def layout_params(ctx_params, llama_version: str) -> dict:
    """The context parameters that change the KV layout of a saved sequence.

    The slot count and ``kv_unified`` only change the stream framing, which
    kvblob normalizes away, so they are recorded but not part of the key.
    """
    return {
        "n_ctx_seq": ctx_params.n_ctx_seq, "type_k": ctx_params.type_k, "type_v": ctx_params.type_v,
        "flash_attn": ctx_params.flash_attn, "swa_full": ctx_params.swa_full, "llama_cpp": llama_version,
    }


def layout_key(params: dict) -> bytes:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).digest()
