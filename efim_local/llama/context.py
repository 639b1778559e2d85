"""Owning wrapper for ``llama_context``: one context, several sequences (slots)."""

from __future__ import annotations

import ctypes

import numpy as np

from ._handle import Handle
from ._lib import lib
from .batch import Batch
from .errors import BackendError, DecodeError, Interrupted, NoKvSlot
from .model import Model
from ..config import KV_TYPES, ContextParams

# ggml's CPU backend asks an abort callback between graph nodes, on a compute thread. A Python
# callback would take the GIL hundreds of times a batch; libc's strlen reads a flag byte without it:
# strlen(flag) is nonzero exactly when flag[0] is (the bool return is its low byte; flag[1] stays 0).
_STRLEN = lib.ggml_abort_callback(ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value)


class Context(Handle):
    """A llama.cpp context with ``n_slots`` sequences sharing one unified KV cache."""

    def __init__(self, model: Model, params: ContextParams, eval_callback=None):
        """``eval_callback``: a ``ggml_backend_sched_eval_callback`` kept alive with the context
        (see infinigen.capture); None for none, which is what the keystroke path uses."""
        import os

        self.model = model
        self.params = params
        p = lib.llama_context_default_params()
        p.n_seq_max = params.n_slots
        p.n_ctx = params.n_ctx_seq * params.n_slots
        p.n_batch = params.n_batch
        p.n_ubatch = params.n_batch
        # 0: every core, until the engine counts the free ones (engine/cpu.py) before its first decode.
        cores = os.cpu_count() or 1
        p.n_threads, p.n_threads_batch = params.n_threads or cores, params.n_threads_batch or cores
        p.kv_unified = params.kv_unified
        p.swa_full = params.swa_full
        p.offload_kqv = params.offload_kqv
        p.flash_attn_type = 1 if params.flash_attn else 0
        for name in ("type_k", "type_v"):
            t = getattr(params, name)
            if t not in KV_TYPES:
                raise BackendError(f"unsupported KV type {t!r}; use one of {', '.join(KV_TYPES)}")
            setattr(p, name, KV_TYPES[t])
        p.no_perf = True
        self._eval_callback = eval_callback
        if eval_callback is not None:
            p.cb_eval = eval_callback
        ptr = lib.llama_init_from_model(model.ptr, p)
        if not ptr:
            raise BackendError("llama.cpp could not create a context (out of memory?)")
        self.ptr = ptr
        self._open = True
        self.mem = lib.llama_get_memory(ptr)
        self.n_threads, self.n_threads_batch = p.n_threads, p.n_threads_batch
        self.n_ctx = lib.llama_n_ctx(ptr)
        self.n_ctx_seq = lib.llama_n_ctx_seq(ptr)
        self.n_batch = lib.llama_n_batch(ptr)
        self.n_vocab = model.n_vocab
        self._stop = (ctypes.c_uint8 * 2)()  # [1, 0]: an interruptible decode stops
        self._never = (ctypes.c_uint8 * 2)()  # always [0, 0]: what other decodes read
        self._armed = False
        lib.llama_set_abort_callback(ptr, _STRLEN, ctypes.addressof(self._never))

    def _free(self) -> None:
        lib.llama_free(self.ptr)
        self.ptr = None

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Threads for single-token decodes and for batches, from the next decode on."""
        lib.llama_set_n_threads(self.ptr, n_threads, n_threads_batch)
        self.n_threads, self.n_threads_batch = n_threads, n_threads_batch

    # -- decoding -------------------------------------------------------
    def interrupt(self) -> None:
        """Stop the interruptible decode running now, or the next one (any thread: one byte)."""
        self._stop[0] = 1

    def clear_interrupt(self) -> None:
        self._stop[0] = 0

    def decode(self, batch: Batch, interruptible: bool = False) -> None:
        """Decode ``batch``. ``interruptible``: :meth:`interrupt` stops it between two graph nodes
        (Interrupted; llama.cpp drops the batch's KV, earlier batches stay)."""
        if interruptible != self._armed:
            lib.llama_set_abort_callback(self.ptr, _STRLEN,
                                         ctypes.addressof(self._stop if interruptible else self._never))
            self._armed = interruptible
        rc = lib.llama_decode(self.ptr, batch.raw)
        if rc == 1:
            raise NoKvSlot("no KV cache slot for the batch")
        if rc == 2 and interruptible:
            raise Interrupted()
        if rc != 0:
            raise DecodeError(f"llama_decode failed with code {rc}")

    def logits(self, i: int) -> np.ndarray:
        """Logits of the i-th output row of the last batch (a copy)."""
        ptr = lib.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise BackendError(f"no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def argmax(self, i: int) -> int:
        """The greedy token of the i-th output row of the last batch (no copy of the logits)."""
        ptr = lib.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise BackendError(f"no logits for batch row {i}")
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    # -- sequences --------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> bool:
        """Remove cells of ``seq`` in [p0, p1). False if a partial removal is impossible."""
        return bool(lib.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return lib.llama_memory_seq_pos_max(self.mem, seq)

    def clear(self) -> None:
        lib.llama_memory_clear(self.mem, True)

    # -- state ----------------------------------------------------------
    def seq_state(self, seq: int) -> bytes:
        """Serialize one sequence's KV cells (llama_state_seq_get_data)."""
        size = lib.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        n = lib.llama_state_seq_get_data(self.ptr, buf, size, seq)
        if n == 0 and size:
            raise BackendError("could not serialize sequence state")
        return bytes(memoryview(buf)[:n])

    def set_seq_state(self, seq: int, data: bytes) -> None:
        """Load a sequence state produced by seq_state() into ``seq``."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if lib.llama_state_seq_set_data(self.ptr, buf, len(data), seq) == 0:
            raise BackendError("llama.cpp rejected the sequence state")
