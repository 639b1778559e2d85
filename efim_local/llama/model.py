"""Owning wrapper for ``llama_model`` plus its vocabulary."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ._handle import Handle
from ._lib import ensure_backend, lib
from .errors import BackendError, ModelError

GGUF_MAGIC = b"GGUF"
_FIM_GETTERS = {
    "pre": "llama_vocab_fim_pre", "suf": "llama_vocab_fim_suf", "mid": "llama_vocab_fim_mid",
    "pad": "llama_vocab_fim_pad", "rep": "llama_vocab_fim_rep", "sep": "llama_vocab_fim_sep",
}


def check_gguf(path: str | os.PathLike) -> Path:
    """Raise ModelError with a one-line reason unless ``path`` is a readable GGUF file."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    with open(p, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelError(f"not a GGUF model file: {p}")
    return p


class Model(Handle):
    """A loaded GGUF model. Use as a context manager, or call close()."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, use_mmap: bool = True,
                 main_gpu: int = 0, vocab_only: bool = False):
        ensure_backend()
        self.path = check_gguf(path)
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.main_gpu = main_gpu
        params.use_mmap = use_mmap
        params.vocab_only = vocab_only  # tokenizer only: for planning prompts another process runs
        ptr = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            raise ModelError(f"llama.cpp could not load {self.path} (unsupported architecture or corrupt file)")
        self.ptr = ptr
        self._open = True
        self.vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.n_layer = lib.llama_model_n_layer(ptr)
        self.n_ctx_train = lib.llama_model_n_ctx_train(ptr)
        self.n_swa = lib.llama_model_n_swa(ptr)
        self.n_params = lib.llama_model_n_params(ptr)
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self.vocab))
        bos = lib.llama_vocab_bos(self.vocab)
        self.bos: tuple[int, ...] = (bos,) if self.add_bos and bos >= 0 else ()
        self._pieces: list[bytes | None] = [None] * self.n_vocab

    def _free(self) -> None:
        lib.llama_model_free(self.ptr)
        self.ptr = None

    # -- metadata -------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def fim_ids(self) -> dict[str, int]:
        out = {}
        for name, fn in _FIM_GETTERS.items():
            tid = getattr(lib, fn)(self.vocab)
            if tid >= 0:
                out[name] = tid
        return out

    def is_eog(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_eog(self.vocab, token))

    def is_control(self, token: int) -> bool:
        """A special token (FIM and chat markers, ends): never text of an answer."""
        return bool(lib.llama_vocab_is_control(self.vocab, token))

    # -- tokens ---------------------------------------------------------
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Tokenize text without adding BOS. ``special`` parses control-token texts."""
        data = text.encode("utf-8")
        buf = (lib.llama_token * (len(data) + 8))()  # never more tokens than bytes
        n = lib.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, special)
        if n < 0:
            raise ModelError("tokenization failed")
        return buf[:n]

    def token_id(self, text: str) -> int | None:
        """The id of a token whose text is exactly ``text`` (special tokens included)."""
        ids = self.tokenize(text, special=True)
        if len(ids) == 1 and self.piece(ids[0], special=True) == text.encode("utf-8"):
            return ids[0]
        return None

    def piece(self, token: int, special: bool = False) -> bytes:
        """Bytes of one token (control tokens render empty unless ``special``). An id outside the
        vocabulary is a BackendError: llama.cpp would abort the process (``std::out_of_range``), and a
        negative one would index the cache from its end."""
        if not 0 <= token < self.n_vocab:
            raise BackendError(f"token id {token} is not in the model's vocabulary [0, {self.n_vocab})")
        if not special:
            cached = self._pieces[token]
            if cached is not None:
                return cached
        buf = ctypes.create_string_buffer(64)
        n = lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        out = buf.raw[:n]
        if not special:
            self._pieces[token] = out
        return out

    def detokenize(self, tokens) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")
