"""The on-disk state file: raw bytes, a versioned header, a checksum. No pickle.

    offset  size  field
    0       8     magic b"EFIMKVST"
    8       2     format version (u16)
    10      2     header JSON length (u16, <= 4096)
    12      4     n_tokens (u32)
    16      8     payload length (u64)
    24      32    model fingerprint (sha256)
    56      32    layout key (sha256 of the KV-layout parameters)
    88      32    sha256 over bytes [0, 88) + header JSON + tokens + payload
    120     ...   header JSON (the layout parameters, readable), tokens (i32 LE), payload

The payload is a normalized sequence state (see kvblob). Every length read
back is checked against limits and against the file's actual size.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import StateFileError

MAGIC = b"EFIMKVST"
VERSION = 1
_HEAD = struct.Struct("<8sHHIQ32s32s")  # 88 bytes
_FULL = _HEAD.size + 32
MAX_JSON = 4096
MAX_TOKENS = 1 << 21
MAX_PAYLOAD = 16 << 30




@dataclass(frozen=True)
class Header:
    version: int
    n_tokens: int
    payload_len: int
    model: bytes
    layout: bytes
    checksum: bytes
    params: dict


def encode_header(tokens: np.ndarray, payload: bytes, model: bytes, layout: bytes, params: dict) -> tuple[bytes, bytes]:
    """Return (header bytes, token bytes) for a state file."""
    js = json.dumps(params, sort_keys=True).encode()
    if len(js) > MAX_JSON:
        raise ValueError("layout parameters too large")
    toks = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    head = _HEAD.pack(MAGIC, VERSION, len(js), len(tokens), len(payload), model, layout)
    h = hashlib.sha256(head)
    h.update(js)
    h.update(toks)
    h.update(payload)
    return head + h.digest() + js, toks


def write(path: Path, tokens: np.ndarray, payload: bytes, model: bytes, layout: bytes, params: dict) -> int:
    """Atomically write a state file (temp file, fsync, rename). Returns its size."""
    head, toks = encode_header(tokens, payload, model, layout, params)
    return write_private(path, head, toks, payload)


def write_private(path: Path, *parts: bytes) -> int:
    """Atomically write ``parts`` to an owner-only file: temp file, fsync, rename, dir fsync."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return sum(len(p) for p in parts)


def _read_header(f, size: int, model: bytes | None, layout: bytes | None) -> tuple[Header, bytes]:
    raw = f.read(_FULL)
    if len(raw) < _FULL:
        raise StateFileError("corrupt", "state file is truncated")
    magic, version, js_len, n_tokens, payload_len, fp, lay = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise StateFileError("corrupt", "not an efim state file")
    if version != VERSION:
        raise StateFileError("old_format", f"state format version {version}, expected {VERSION}")
    if js_len > MAX_JSON or n_tokens > MAX_TOKENS or payload_len > MAX_PAYLOAD:
        raise StateFileError("corrupt", "state header sizes out of range")
    if size != _FULL + js_len + 4 * n_tokens + payload_len:
        raise StateFileError("corrupt", "state file size does not match its header")
    if model is not None and fp != model:
        raise StateFileError("model_changed", "state was saved for another model")
    if layout is not None and lay != layout:
        raise StateFileError("layout_changed", "state was saved with other KV layout parameters")
    js = f.read(js_len)
    try:
        params = json.loads(js)
    except ValueError:
        raise StateFileError("corrupt", "state header JSON is corrupt") from None
    return Header(version, n_tokens, payload_len, fp, lay, raw[_HEAD.size:_FULL], params), raw[:_HEAD.size] + js


def read_tokens(path: Path, model: bytes | None = None, layout: bytes | None = None) -> tuple[Header, np.ndarray]:
    """Read the header and token list only (cheap: used to rank candidates)."""
    with open(path, "rb") as f:
        head, _ = _read_header(f, os.fstat(f.fileno()).st_size, model, layout)
        toks = np.frombuffer(f.read(4 * head.n_tokens), dtype="<i4")
    if len(toks) != head.n_tokens:
        raise StateFileError("corrupt", "state file is truncated")
    return head, toks.astype(np.int32)


def read(path: Path, model: bytes | None = None, layout: bytes | None = None) -> tuple[Header, np.ndarray, bytes]:
    """Read and verify a whole state file; raises StateFileError with a reason."""
    with open(path, "rb") as f:
        head, prefix = _read_header(f, os.fstat(f.fileno()).st_size, model, layout)
        toks = f.read(4 * head.n_tokens)
        payload = f.read(head.payload_len)
    if len(toks) != 4 * head.n_tokens or len(payload) != head.payload_len:
        raise StateFileError("corrupt", "state file is truncated")
    h = hashlib.sha256(prefix)
    h.update(toks)
    h.update(payload)
    if h.digest() != head.checksum:
        raise StateFileError("corrupt", "state file checksum mismatch")
    return head, np.frombuffer(toks, dtype="<i4").astype(np.int32), payload


def encoded_size(tokens: np.ndarray, payload: bytes, params: dict) -> int:
    """Size of the file ``write`` would produce."""
    return _FULL + len(json.dumps(params, sort_keys=True).encode()) + 4 * len(tokens) + len(payload)
