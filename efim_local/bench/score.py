"""Teacher-forced scoring: the log-likelihood of a target text after a prompt, with llama.cpp.

One context, a sequence per kind of prompt (``seq``); consecutive prompts in a sequence that share a
head reuse its KV cells (a cell that was computed stays valid for any continuation of the same
tokens), so scoring a replay whose prompts grow keystroke by keystroke costs the new tokens only.
The per-token log-probabilities equal a cold decode's (tests/engine/test_bench_score.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

LN2 = math.log(2)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Scorer:
    """``logprobs(prompt, target)``: natural-log probability of each target token after ``prompt``."""

    def __init__(self, model: str | Path, n_ctx: int = 8192, threads: int = 1, n_batch: int = 512, n_seqs: int = 1):
        from ..config import ContextParams
        from ..llama import Batch, Context, Model

        self.model = Model(model)
        params = ContextParams(n_ctx_seq=n_ctx, n_slots=n_seqs, n_batch=n_batch, n_threads=threads,
                               n_threads_batch=threads, swa_full=True)
        self.ctx = Context(self.model, params)
        self.batch = Batch(self.ctx.n_batch, n_seqs)
        self.n_ctx = self.ctx.n_ctx_seq
        self.cached: list[list[int]] = [[] for _ in range(n_seqs)]  # the tokens each sequence's cells hold
        self.evaluated = 0  # tokens decoded so far (a measure of the reuse)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def logprobs(self, prompt: list[int], target: list[int], seq: int = 0) -> list[float]:
        """Log-probability of each ``target`` token given ``prompt`` and the target tokens before it,
        computed in sequence ``seq`` (whose cells of an earlier prompt are reused as far as they match)."""
        if not prompt or not target:
            raise ValueError("scoring needs a non-empty prompt and target")
        sid, seq = seq, [*prompt, *target]
        if len(seq) > self.n_ctx:
            raise ValueError(f"{len(seq)} tokens do not fit the scorer's context of {self.n_ctx}")
        first = len(prompt) - 1  # the row whose logits predict the first target token
        keep = 0
        for a, b in zip(self.cached[sid], seq[:first]):  # decode again from ``first`` at the latest
            if a != b:
                break
            keep += 1
        if not self.ctx.seq_rm(sid, keep, -1):
            keep = 0
            self.ctx.seq_rm(sid, 0, -1)
        self.cached[sid] = self.cached[sid][:keep]
        out: list[float] = []
        pos = keep
        while pos < len(seq):
            self.batch.clear()
            rows = []
            for p in range(pos, min(len(seq), pos + self.ctx.n_batch)):
                want = first <= p < len(seq) - 1
                i = self.batch.add(seq[p], p, sid, logits=want)
                if want:
                    rows.append((i, seq[p + 1]))
            self.ctx.decode(self.batch)
            self.evaluated += len(self.batch)
            out += [float(log_softmax(self.ctx.logits(i))[tok]) for i, tok in rows]
            pos += len(self.batch)
            self.cached[sid] = seq[:pos]
        return out

    def bits(self, prompt: list[int], target: list[int], seq: int = 0) -> float:
        """Bits to encode ``target`` after ``prompt`` (the negated log2-likelihood)."""
        return -sum(self.logprobs(prompt, target, seq)) / LN2
