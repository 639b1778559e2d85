"""Parse and rewrite llama.cpp sequence-state blobs (``llama_state_seq_get_data``).

Layout (``llama_context::state_seq_get_data`` then ``llama_kv_cache::state_write``;
a sliding-window model writes two caches back to back, the full-attention one first):

    u32 magic 0xaf143cd8, i32 seq_id
    u32 n_stream
    per stream: u32 cell_count, and when non-zero:
        cell_count x (i32 pos, u32 n_seq_id = 1, i32 seq_id)
        u32 v_trans, u32 n_layer
        n_layer x (i32 k_type, u64 k_row_size, cell_count rows)
        v_trans == 0: n_layer x (i32 v_type, u64 v_row_size, cell_count rows)
        v_trans == 1: n_layer x (i32 v_type, u32 v_el_size, u32 n_embd_v, n_embd_v x cell_count elements)

A single sequence fills one stream. We store that stream's section only
(``normalize``) and wrap it for the restoring context's stream count
(``wrap``), so states survive a change in the number of slots. ``select``
keeps a subset of cells, with their original positions, by rewriting every
layer's rows with numpy: no Python loop over cells.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import StoreError

_U32 = struct.Struct("<I")
_PREFIX = struct.Struct("<Ii")
IO_MAGIC = 0xAF143CD8
_LAYER_K = struct.Struct("<iQ")
_LAYER_VT = struct.Struct("<iII")
MAX_LAYERS = 4096
MAX_CELLS = 1 << 22


class BlobError(StoreError):
    """The blob does not parse as a single-sequence KV state."""


@dataclass
class Section:
    """One cache's cells of one sequence."""

    cell_count: int
    pos: np.ndarray  # int32 [cell_count]
    v_trans: int
    k_layers: list[tuple[int, int, int]] = field(default_factory=list)  # (type, row_size, offset)
    v_layers: list[tuple[int, int, int, int]] = field(default_factory=list)  # (type, row/el size, n_embd_v, offset)
    start: int = 0  # offset of cell_count in the source buffer
    end: int = 0


@dataclass
class Blob:
    data: bytes
    sections: list[Section | None]  # one per cache; None: the cache holds no cells


class _Reader:
    def __init__(self, data: bytes, off: int = 0):
        self.data, self.off = data, off

    def take(self, n: int) -> int:
        if n < 0 or self.off + n > len(self.data):
            raise BlobError("blob is truncated")
        o = self.off
        self.off += n
        return o

    def u32(self) -> int:
        return _U32.unpack_from(self.data, self.take(4))[0]

    def peek_u32(self) -> int:
        if self.off + 4 > len(self.data):
            raise BlobError("blob is truncated")
        return _U32.unpack_from(self.data, self.off)[0]

    def section_or_empty(self) -> "Section | None":
        if self.peek_u32() == 0:
            self.u32()
            return None
        return _section(self)


def _section(r: _Reader) -> Section:
    start = r.off
    n = r.u32()
    if n > MAX_CELLS:
        raise BlobError(f"cell count {n} out of range")
    meta = np.frombuffer(r.data, dtype="<i4", count=3 * n, offset=r.take(12 * n)).reshape(n, 3)
    if n and not (meta[:, 1] == 1).all():
        raise BlobError("cells with several sequences are not supported")
    sec = Section(n, meta[:, 0].copy(), 0, start=start)
    sec.v_trans = r.u32()
    n_layer = r.u32()
    if sec.v_trans > 1 or n_layer > MAX_LAYERS:
        raise BlobError("bad layer header")
    for _ in range(n_layer):
        t, row = _LAYER_K.unpack_from(r.data, r.take(_LAYER_K.size))
        if row > 1 << 24:
            raise BlobError("key row size out of range")
        sec.k_layers.append((t, row, r.take(row * n)))
    for _ in range(n_layer):
        if sec.v_trans:
            t, el, n_embd = _LAYER_VT.unpack_from(r.data, r.take(_LAYER_VT.size))
            if el > 16 or n_embd > 1 << 20:
                raise BlobError("value layer header out of range")
            sec.v_layers.append((t, el, n_embd, r.take(el * n_embd * n)))
        else:
            t, row = _LAYER_K.unpack_from(r.data, r.take(_LAYER_K.size))
            if row > 1 << 24:
                raise BlobError("value row size out of range")
            sec.v_layers.append((t, row, 0, r.take(row * n)))
    sec.end = r.off
    return sec


def parse(data: bytes, n_stream: int | None = None) -> Blob:
    """Parse a raw state blob as written by llama.cpp for one sequence."""
    r = _Reader(data)
    if r.u32() != IO_MAGIC:
        raise BlobError("not a llama.cpp sequence state")
    r.take(4)  # the source sequence id
    sections: list[Section | None] = []
    while r.off < len(data):
        ns = r.u32()
        if ns == 0 or ns > 4096 or (n_stream is not None and ns != n_stream):
            raise BlobError(f"unexpected stream count {ns}")
        found = [sec for sec in (r.section_or_empty() for _ in range(ns)) if sec is not None]
        if len(found) > 1:
            raise BlobError("a sequence spans several streams")
        sections.append(found[0] if found else None)
        if len(sections) > 2:
            raise BlobError("more than two caches")
    if not sections:
        raise BlobError("empty blob")
    return Blob(data, sections)


def parse_normalized(data: bytes) -> Blob:
    """Parse what ``normalize`` produced: per cache, one section (or a bare 0)."""
    r = _Reader(data)
    sections: list[Section | None] = []
    while r.off < len(data):
        sections.append(r.section_or_empty())
        if len(sections) > 2:
            raise BlobError("more than two caches")
    if not sections:
        raise BlobError("empty blob")
    return Blob(data, sections)


def normalize(data: bytes) -> bytes:
    """Drop the stream framing: per cache, keep only the sequence's own section."""
    blob = parse(data)
    return b"".join(blob.data[s.start:s.end] if s else _U32.pack(0) for s in blob.sections)


def wrap(normalized: bytes, n_stream: int) -> bytes:
    """Frame a normalized state for a context with ``n_stream`` KV streams."""
    blob = parse_normalized(normalized)
    empty = _U32.pack(0) * (n_stream - 1)
    return _PREFIX.pack(IO_MAGIC, 0) + b"".join(
        _U32.pack(n_stream) + (blob.data[s.start:s.end] if s else _U32.pack(0)) + empty for s in blob.sections)


def positions(normalized: bytes) -> list[np.ndarray]:
    return [s.pos if s else np.zeros(0, np.int32) for s in parse_normalized(normalized).sections]


def select(normalized: bytes, keep) -> bytes:
    """Keep only cells for which ``keep(pos_array) -> bool mask`` holds, in every cache."""
    blob = parse_normalized(normalized)
    return select_cells(blob, [None if s is None else keep(s.pos) for s in blob.sections])


def select_cells(blob: Blob, masks: list) -> bytes:
    """Keep the cells each section's boolean mask marks (one mask per section, in order)."""
    if len(masks) != len(blob.sections):
        raise BlobError("one mask per cache section is needed")
    out = []
    for s, mask in zip(blob.sections, masks):
        if s is None:
            out.append(_U32.pack(0))
            continue
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (s.cell_count,):
            raise BlobError("mask does not match the section's cells")
        n = int(mask.sum())
        if n == 0:
            out.append(_U32.pack(0))
            continue
        d = blob.data
        meta = np.frombuffer(d, dtype="<i4", count=3 * s.cell_count, offset=s.start + 4).reshape(-1, 3)[mask]
        parts = [_U32.pack(n), meta.tobytes(), _U32.pack(s.v_trans), _U32.pack(len(s.k_layers))]
        for t, row, off in s.k_layers:
            rows = np.frombuffer(d, np.uint8, row * s.cell_count, off).reshape(s.cell_count, row)[mask]
            parts += [_LAYER_K.pack(t, row), rows.tobytes()]
        for t, size, n_embd, off in s.v_layers:
            if s.v_trans:
                cols = np.frombuffer(d, np.uint8, size * n_embd * s.cell_count, off).reshape(n_embd, s.cell_count, size)
                parts += [_LAYER_VT.pack(t, size, n_embd), cols[:, mask].tobytes()]
            else:
                rows = np.frombuffer(d, np.uint8, size * s.cell_count, off).reshape(s.cell_count, size)[mask]
                parts += [_LAYER_K.pack(t, size), rows.tobytes()]
        out.append(b"".join(parts))
    return b"".join(out)


def truncate(normalized: bytes, n_tokens: int) -> bytes:
    """Keep the cells of positions [0, n_tokens)."""
    return select(normalized, lambda pos: pos < n_tokens)
