"""Copy a GGUF, marking unused vocabulary tokens as FIM tokens.

For timing only: llama-server's ``/infill`` refuses models without FIM tokens, and gemma3-270m has
none. Its ``<unused0>``..``<unused2>`` tokens become PRE/SUF/MID, so every benchmark path runs the
same weights with the same markers. The completions mean nothing; the timings are real.
"""

from __future__ import annotations

from pathlib import Path

import gguf

FIM_KEYS = ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.fim_mid_token_id")


def unused_tokens(reader: gguf.GGUFReader, n: int = 3) -> list[int]:
    """Ids of the first ``n`` tokens named like ``<unused0>``."""
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    ids = [i for i, t in enumerate(tokens) if t.startswith("<unused")][:n]
    if len(ids) < n:
        raise ValueError("the vocabulary has no unused tokens to mark as FIM tokens")
    return ids


def with_fim_tokens(src: str | Path, dst: str | Path, ids: list[int] | None = None) -> Path:
    """Write ``dst``: ``src`` with PRE/SUF/MID token ids set to ``ids`` (default: the first unused
    tokens). Skipped when ``dst`` is already newer than ``src``."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    r = gguf.GGUFReader(src)
    ids = ids or unused_tokens(r)
    arch = r.fields["general.architecture"].contents()
    tmp = dst.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, arch=arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in FIM_KEYS:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub)
    for key, tid in zip(FIM_KEYS, ids):
        w.add_uint32(key, tid)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # quantized: shape from the bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dst)
    return dst
