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

import errno
import hashlib
import json
import mmap
import os
import shutil
import stat
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
HASH_CHUNK = 16 << 20  # checksum in chunks over a map of the file: no copy before it is verified


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
    """Atomically write ``parts`` to an owner-only file: temp file, fsync, rename, dir fsync.

    The temp file is created with O_EXCL|O_NOFOLLOW: a planted file or symlink under its name
    is removed, never written through."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    remove(tmp)  # ours from an interrupted save, or planted: never follow it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return sum(len(p) for p in parts)


def remove(path: Path) -> None:
    """Delete whatever is at ``path`` (file, symlink, FIFO, or a directory planted there); never
    follows a symlink. A missing path is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):  # Linux says EISDIR, others EPERM
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            raise


def open_regular(path: Path, max_bytes: int | None = None, nonblock: bool = True):
    """A binary file object for ``path`` if it is a regular file (a FIFO, device, directory or
    symlink is refused without blocking: O_NOFOLLOW|O_NONBLOCK, then fstat), no larger than
    ``max_bytes``. Raises StateFileError("corrupt") otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if nonblock else 0))
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise StateFileError("corrupt", "not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StateFileError("corrupt", "not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        os.close(fd)
        raise StateFileError("corrupt", f"file of {st.st_size} bytes is over its {max_bytes}-byte bound")
    return os.fdopen(fd, "rb")


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


def read_tokens(path: Path, model: bytes | None = None, layout: bytes | None = None,
                max_bytes: int | None = None) -> tuple[Header, np.ndarray]:
    """Read the header and token list only (cheap: used to rank candidates)."""
    with open_regular(path, max_bytes) as f:
        head, _ = _read_header(f, os.fstat(f.fileno()).st_size, model, layout)
        toks = np.frombuffer(f.read(4 * head.n_tokens), dtype="<i4")
    if len(toks) != head.n_tokens:
        raise StateFileError("corrupt", "state file is truncated")
    return head, toks.astype(np.int32)


def read(path: Path, model: bytes | None = None, layout: bytes | None = None,
         max_bytes: int | None = None) -> tuple[Header, np.ndarray, bytes]:
    """Read and verify a whole state file; raises StateFileError with a reason.

    The checksum is verified over a read-only map of the file before anything is copied, so a
    header that lies about its sizes (a sparse file of matching size) costs no memory."""
    with open_regular(path, max_bytes) as f:
        size = os.fstat(f.fileno()).st_size
        head, prefix = _read_header(f, size, model, layout)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            start = _FULL + len(prefix) - _HEAD.size
            n_tok = 4 * head.n_tokens
            h = hashlib.sha256(prefix)
            view = memoryview(m)
            try:
                for off in range(start, size, HASH_CHUNK):
                    h.update(view[off:min(off + HASH_CHUNK, size)])
                if h.digest() != head.checksum:
                    raise StateFileError("corrupt", "state file checksum mismatch")
                toks = np.frombuffer(view[start:start + n_tok], dtype="<i4").astype(np.int32)
                payload = bytes(view[start + n_tok:size])
            finally:
                view.release()
    return head, toks, payload


def encoded_size(tokens: np.ndarray, payload: bytes, params: dict) -> int:
    """Size of the file ``write`` would produce."""
    return _FULL + len(json.dumps(params, sort_keys=True).encode()) + 4 * len(tokens) + len(payload)
