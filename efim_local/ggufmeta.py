"""A GGUF file's metadata, read fast: scalar and string values by key, and where each array lies.

``gguf.GGUFReader`` builds a numpy view for every element of every array: for a 262k-token
vocabulary that is ~18 s of CPU, paid twice by ``efim models pull --use``. Here arrays are skipped
(a string array by its lengths alone) and only their byte span is kept, which is enough to ask
whether the vocabulary holds a token (catalog.py's FIM family check).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from .errors import ModelError

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Meta:
    """Scalars and strings by key (``values``), and arrays as (element type, count, start, end)."""

    def __init__(self, values: dict, arrays: dict, data: mmap.mmap):
        self.values, self.arrays, self._data = values, arrays, data

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
    """The metadata of the GGUF at ``path`` (a private read-only map); ModelError if it is malformed."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ModelError(f"{path} is not a GGUF file") from None
    try:
        return _parse(data)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        data.close()
        raise ModelError(f"{path}: unreadable GGUF metadata ({e or type(e).__name__})") from None


def _parse(data: mmap.mmap) -> Meta:
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2 or n_kv > 1 << 20:
        raise ValueError(f"version {version}, {n_kv} keys")
    pos, size = 24, len(data)
    values, arrays = {}, {}

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
    return Meta(values, arrays, data)
