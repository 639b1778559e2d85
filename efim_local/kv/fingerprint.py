"""What makes a saved state usable: the same model, the same KV layout.

The model fingerprint is a sha256 over the whole GGUF file (a hash of its 64 MiB chunks' sha256s,
computed in parallel): header, metadata and every byte of tensor data, so two fine-tunes of one
base model (same size, same metadata) never share it. GGUF has no standard content hash in its
metadata (``general.uuid`` is optional and not tied to the data), so efim computes one, once per
file (docs/reliability.md has its cost). The result is cached in the state store by (device,
inode, size, mtime_ns), so a restart does not rehash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from ..errors import StateFileError

log = logging.getLogger("efim.store")
VERSION = b"efim-model-v2"  # v1 hashed only the first 8 MiB and the last MiB
CHUNK = 64 << 20  # hashlib releases the GIL on large buffers
CACHE_FILE = "fingerprints.json"
CACHE_ENTRIES = 64
CACHE_MAX_BYTES = 1 << 20


def hash_file(path: str | Path) -> bytes:
    """sha256 over the fingerprint version, the file size and the sha256 of each 64 MiB chunk of
    the file, the chunks hashed in parallel over a read-only map (hashlib releases the GIL)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256(VERSION)
        h.update(size.to_bytes(8, "little"))
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
                        for d in pool.map(lambda off: hashlib.sha256(view[off:off + CHUNK]).digest(),
                                          range(0, size, CHUNK)):
                            h.update(d)
                finally:
                    view.release()
    return h.digest()


@lru_cache(maxsize=16)
def _fingerprint(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> bytes:
    return hash_file(path)


def _file_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _read_cache(path: Path) -> dict:
    from . import stateformat

    try:
        with stateformat.open_regular(path, CACHE_MAX_BYTES) as f:
            data = json.loads(f.read(CACHE_MAX_BYTES + 1))
    except (OSError, StateFileError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_fingerprint(path: str | Path, cache_dir: Path | None = None) -> bytes:
    """The model's fingerprint (see the module docstring). With ``cache_dir`` (the state store),
    a file seen before with the same (device, inode, size, mtime_ns) is not hashed again; a cache
    that cannot be written (a full or read-only disk) only costs the next start its hash."""
    st = os.stat(path)
    key = _file_key(st)
    cache = _read_cache(cache_dir / CACHE_FILE) if cache_dir is not None else {}
    hit = cache.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("sha256"), str) and len(hit["sha256"]) == 64:
        try:
            return bytes.fromhex(hit["sha256"])
        except ValueError:
            pass
    fp = _fingerprint(str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if cache_dir is not None:
        from . import stateformat

        cache.pop(key, None)
        cache[key] = {"path": str(Path(path).resolve()), "sha256": fp.hex()}
        keep = dict(list(cache.items())[-CACHE_ENTRIES:])  # newest last
        try:
            stateformat.write_private(cache_dir / CACHE_FILE, json.dumps(keep, indent=0).encode())
        except OSError as e:
            log.debug("model fingerprint not cached: %s", e)
    return fp


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
