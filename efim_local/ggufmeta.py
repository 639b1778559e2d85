"""A GGUF file's metadata, read fast: scalar and string values by key, and where each array lies.

``gguf.GGUFReader`` builds a numpy view for every element of every array: for a 262k-token
vocabulary that is ~18 s of CPU, paid twice by ``efim models pull --use``. Here arrays are skipped
(a string array by its lengths alone) and only their byte span is kept, which is enough to ask
whether the vocabulary holds a token (catalog.py's FIM family check).

The whole header is checked as llama.cpp's loader would (gguf.cpp, llama-model-loader.cpp): the
version, counts a file of this size can hold, and every tensor's type, shape, offset and data
inside the file. A file that passes is one llama.cpp will not refuse for its layout, so ``efim models
use`` cannot write a model into config.toml that every later command fails to load.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from .errors import ModelError

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)  # llama.cpp reads these (v1 is refused since 2023)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; general.alignment overrides it
MIN_KV, MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8  # the fewest bytes a key/value and a tensor record take


class Meta:
    """Scalars and strings by key (``values``), and arrays as (element type, count, start, end)."""

    def __init__(self, values: dict, arrays: dict, data: mmap.mmap, tensors: dict | None = None):
        self.values, self.arrays, self._data = values, arrays, data
        self.tensors = tensors or {}  # name -> (ggml type, shape, start, end): the data's bytes in the file

    def get(self, key: str):
        return self.values.get(key)

    def has_token(self, key: str, text: str) -> bool:
        """Whether the string array ``key`` holds ``text`` (a search of its bytes for the
        length-prefixed string: GGUF strings are u64 length + UTF-8)."""
        arr = self.arrays.get(key)
        if arr is None or arr[0] != STRING:
            return False
        raw = text.encode()
        return self._data.find(struct.pack("<Q", len(raw)) + raw, arr[2], arr[3]) != -1


def read(path: str | Path) -> Meta:
    """The metadata of the GGUF at ``path`` (a private read-only map), its header checked whole (the
    module's docstring); ModelError saying what is wrong if it is malformed or truncated."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ModelError(f"{path} is not a GGUF file") from None
    try:
        return _parse(data)
    except struct.error:  # a read past the end
        data.close()
        raise ModelError(f"{path}: GGUF header cut short (a truncated file?)") from None
    except (UnicodeDecodeError, ValueError, IndexError, OverflowError) as e:
        data.close()
        raise ModelError(f"{path}: not a usable GGUF file ({e or type(e).__name__})") from None


def _parse(data: mmap.mmap) -> Meta:
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    size = len(data)
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version}; llama.cpp reads versions {' and '.join(map(str, VERSIONS))}")
    # Counts the file cannot hold are refused before any loop runs on them (2**64 - 1 tensors).
    if n_kv > (size - 24) // MIN_KV:
        raise ValueError(f"{n_kv} metadata keys cannot fit in a file of {size} bytes")
    if n_tensors > (size - 24 - n_kv * MIN_KV) // MIN_TENSOR:
        raise ValueError(f"{n_tensors} tensors cannot fit in a file of {size} bytes")
    pos = 24
    values, arrays, seen = {}, {}, set()

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", data, pos)
        if pos + 8 + n > size:
            raise ValueError("a string runs past the end of the file")
        return data[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if kind == STRING:
            values[key], pos = string(pos)
        elif kind in _SCALAR:
            (values[key],) = struct.unpack_from(_SCALAR[kind], data, pos)
            pos += struct.calcsize(_SCALAR[kind])
        elif kind == ARRAY:
            elem, count = struct.unpack_from("<IQ", data, pos)
            start = pos = pos + 12
            if count > (size - pos) // (8 if elem == STRING else struct.calcsize(_SCALAR.get(elem, "B"))):
                raise ValueError(f"{key}: {count} elements cannot fit in the file")
            if elem == STRING:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", data, pos)
                    pos += 8 + n
            elif elem in _SCALAR:
                pos += count * struct.calcsize(_SCALAR[elem])
            else:
                raise ValueError(f"array of type {elem} in {key}")
            if pos > size:
                raise ValueError(f"{key} runs past the end of the file")
            arrays[key] = (elem, count, start, pos)
        else:
            raise ValueError(f"value type {kind} in {key}")
        if key in seen:
            raise ValueError(f"duplicate key {key}")
        seen.add(key)
    tensors = _tensors(data, pos, n_tensors, values.get("general.alignment", DEFAULT_ALIGNMENT), string)
    return Meta(values, arrays, data, tensors)


def _tensors(data: mmap.mmap, pos: int, n: int, alignment, string) -> dict:
    """The tensor records after the metadata, checked as llama.cpp checks them: a known type, at
    most MAX_DIMS dimensions whose first is whole blocks, offsets packed in order at the alignment,
    and every tensor's data inside the file (a truncated download fails here, not at load)."""
    from gguf.constants import GGML_QUANT_SIZES  # {type: (block size, bytes per block)}

    sizes = {int(t): v for t, v in GGML_QUANT_SIZES.items()}
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    pad = lambda x: -(-x // alignment) * alignment
    records = []
    for _ in range(n):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        if n_dims > MAX_DIMS:
            raise ValueError(f"tensor {name}: {n_dims} dimensions (at most {MAX_DIMS})")
        shape = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        kind, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        if any(d >= 1 << 63 for d in shape):
            raise ValueError(f"tensor {name}: a dimension of {max(shape)}")
        if kind not in sizes:
            raise ValueError(f"tensor {name}: unknown ggml type {kind}")
        records.append((name, kind, shape, offset))
    start, expected, size, out = pad(pos), 0, len(data), {}
    for name, kind, shape, offset in records:
        block, block_bytes = sizes[kind]
        if shape and shape[0] % block:
            raise ValueError(f"tensor {name}: {shape[0]} values is not whole blocks of {block}")
        nbytes = block_bytes * (shape[0] // block if shape else 1)
        for d in shape[1:]:
            nbytes *= d
        if offset != expected:
            raise ValueError(f"tensor {name}: data at offset {offset}, where {expected} was due")
        end = start + offset + nbytes
        if end > size:
            raise ValueError(f"tensor {name}: its data ends at byte {end}, past the end of the file ({size} "
                             "bytes): a truncated file?")
        if name in out:
            raise ValueError(f"duplicate tensor {name}")
        out[name] = (kind, shape, start + offset, end)
        expected += pad(nbytes)
    return out
