"""Capture post-RoPE Q and K per layer through llama.cpp's eval callback (``cb_eval``).

llama.cpp names the attention inputs ``Qcur-<layer>`` and ``Kcur-<layer>``; the same name is
given to the tensor before and after RoPE, and the graph computes them in that order, so the
last one seen per layer and ubatch is the post-RoPE one. The callback asks the scheduler to stop
at those nodes only; data is read from host memory (CPU backend).
"""

from __future__ import annotations

import ctypes
import re

import numpy as np

from ...llama._lib import lib

_NAME = re.compile(rb"^([QK])cur-(\d+)$")
GGML_F32 = 0


class _Tensor(ctypes.Structure):
    """The head of ``struct ggml_tensor`` (ggml.h), up to its name."""

    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ]


class QKCapture:
    """An eval callback that records Q and K per layer while ``active``.

    After a decode, ``q[layer]`` is (n_tokens, n_head, head_dim) and ``k[layer]`` is
    (n_tokens, n_head_kv, head_dim), float32, concatenated over the ubatches of the decode.
    """

    def __init__(self):
        self.active = False
        self.layers: set[int] | None = None
        self.kinds: tuple[bytes, ...] = (b"Q", b"K")
        self.q: dict[int, list[np.ndarray]] = {}
        self.k: dict[int, list[np.ndarray]] = {}
        self._last: dict[tuple[bytes, int], np.ndarray] = {}
        self.callback = lib.ggml_backend_sched_eval_callback(self._cb)

    def start(self, layers=None, keys: bool = True) -> None:
        """Record from now on: every layer, or only ``layers``; Q always, K when ``keys``.
        Fewer captured nodes mean fewer graph splits, so a cheaper decode."""
        self.q, self.k, self._last = {}, {}, {}
        self.layers = None if layers is None else set(layers)
        self.kinds = (b"Q", b"K") if keys else (b"Q",)
        self.active = True

    def stop(self) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        self.end_decode()
        self.active = False
        q = {il: np.concatenate(v) for il, v in self.q.items()}
        k = {il: np.concatenate(v) for il, v in self.k.items()}
        return q, k

    def end_decode(self) -> None:
        """Keep the last (post-RoPE) Q and K of each layer from the decode that just ran."""
        for (kind, il), arr in self._last.items():
            (self.q if kind == b"Q" else self.k).setdefault(il, []).append(arr)
        self._last = {}

    def _cb(self, t, ask, _ud) -> bool:
        if not self.active:
            return False
        tensor = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        m = _NAME.match(tensor.name)
        if m is None or m.group(1) not in self.kinds or (
                self.layers is not None and int(m.group(2)) not in self.layers):
            return False
        if ask:
            return True
        kind, il = m.group(1), int(m.group(2))
        if tensor.type == GGML_F32 and tensor.data:
            ne = list(tensor.ne)
            nb = list(tensor.nb)
            buf = (ctypes.c_char * (nb[2] * ne[2])).from_address(tensor.data)
            a = np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.uint8), shape=(ne[2], ne[1], ne[0] * 4),
                                                strides=(nb[2], nb[1], 1))
            self._last[(kind, il)] = a.copy().view(np.float32).reshape(ne[2], ne[1], ne[0])  # the buffer is reused
        return True
