"""Owning wrapper for ``llama_batch``."""

from __future__ import annotations

from typing import Iterable

from ._handle import Handle
from ._lib import lib


class Batch(Handle):
    """A token batch of fixed capacity; tokens may belong to different sequences."""

    def __init__(self, capacity: int, n_seq_max: int = 1):
        self.capacity = capacity
        self.raw = lib.llama_batch_init(capacity, 0, n_seq_max)
        self._open = True
        self.n_outputs = 0

    def _free(self) -> None:
        lib.llama_batch_free(self.raw)

    def __len__(self) -> int:
        return self.raw.n_tokens

    def clear(self) -> None:
        self.raw.n_tokens = 0
        self.n_outputs = 0

    def add(self, token: int, pos: int, seq: int, logits: bool = False) -> int:
        """Append one token; returns its row index (the logits index if requested)."""
        b = self.raw
        i = b.n_tokens
        if i >= self.capacity:
            raise IndexError("batch is full")
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits
        b.n_tokens = i + 1
        self.n_outputs += bool(logits)
        return i

    def extend(self, tokens: Iterable[int], start_pos: int, seq: int) -> None:
        for k, t in enumerate(tokens):
            self.add(t, start_pos + k, seq)
