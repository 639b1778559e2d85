"""Request-time sparse restore: rehearse the tail, choose cells, restore only those, decode.

1. Rehearsal: restore only the sink tokens and the recent window (cheap), decode the request's
   tail with Q captured, then drop it again. Its queries are the speculation's input.
2. Score the saved partial keys with the partial queries (or, for the baselines, do what they do).
3. Restore the chosen cells, with their original positions, through an edited state blob.
The caller then decodes the tail for real and generates. Exactness is given up by design.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ...llama import Batch, Context
from .. import kvblob
from .capture import QKCapture
from .select import SelectConfig, cell_scores, choose, keys_of, partial_keys, window_mask
from .skew import Skew, decode_captured


@dataclass
class SparseResult:
    policy: str
    cells: int  # cells of the state's first section
    kept: int
    bytes_full: int
    bytes_restored: int
    rehearsal_ms: float = 0.0
    select_ms: float = 0.0
    restore_ms: float = 0.0
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))


class SparseRestorer:
    """Holds the context (created with ``cap.callback``), the skew and cached partial keys."""

    def __init__(self, ctx: Context, batch: Batch, cap: QKCapture, skew: Skew, n_stream: int, n_swa: int = 0):
        self.ctx, self.batch, self.cap, self.skew = ctx, batch, cap, skew
        self.n_stream, self.n_swa = n_stream, n_swa

    def masks(self, blob: kvblob.Blob, first: np.ndarray) -> list:
        """Masks for every section: ``first`` for the first, the visible window for a sliding one."""
        out = [first]
        whole = bool(np.all(first))  # a 100% selection restores the state as saved: exact
        for s in blob.sections[1:]:
            if whole:
                out.append(None if s is None else np.ones(s.cell_count, bool))
                continue
            out.append(None if s is None else (
                window_mask(s.pos, self.n_swa) if self.n_swa else np.ones(s.cell_count, bool)))
        return out

    def load(self, seq: int, blob: kvblob.Blob, first: np.ndarray) -> int:
        """Replace ``seq``'s cells with the chosen subset; returns the bytes handed to llama.cpp."""
        data = kvblob.select_cells(blob, self.masks(blob, first))
        self.ctx.seq_rm(seq, 0, -1)
        self.ctx.set_seq_state(seq, kvblob.wrap(data, self.n_stream))
        return len(data)

    def rehearse(self, seq: int, blob: kvblob.Blob, tail, cfg: SelectConfig) -> dict[int, np.ndarray]:
        """Post-RoPE queries of ``tail`` decoded against the sinks and the recent window."""
        pos = blob.sections[0].pos
        rank = np.argsort(np.argsort(pos, kind="stable"), kind="stable")  # 0 = oldest
        base = (rank < cfg.sinks) | (rank >= len(pos) - cfg.recent)
        self.load(seq, blob, base)
        self.cap.start(layers=self.skew.layers_of(0), keys=False)  # only the queries scoring needs
        try:
            # Only the last few tail tokens (right after the state: llama.cpp needs consecutive
            # positions), so the rehearsal stays cheap when the unseen tail is long.
            n = max(1, cfg.queries)
            decode_captured(self.ctx, self.batch, self.cap, tail[-n:], seq, int(pos.max()) + 1)
        finally:
            q, _ = self.cap.stop()
            self.ctx.seq_rm(seq, 0, -1)
        return q

    def restore(self, seq: int, normalized: bytes, tail, cfg: SelectConfig,
                pkeys: dict[int, np.ndarray] | None = None) -> SparseResult:
        """Choose and restore cells of a saved state for a request whose unseen tokens are ``tail``.
        ``pkeys``: the state's saved partial keys for the policy (computed here when None)."""
        blob = kvblob.parse_normalized(normalized)
        sec = blob.sections[0]
        if sec is None:
            raise ValueError("the state holds no cells")
        res = SparseResult(cfg.policy, sec.cell_count, 0, len(normalized), 0)
        scores: tuple = ()  # (rel, mass) for the scoring policies; the others choose by position
        if cfg.policy in ("infinigen", "noskew", "oracle"):
            t0 = time.perf_counter()
            queries = self.rehearse(seq, blob, tail, cfg)
            t1 = time.perf_counter()
            if cfg.policy == "oracle":
                scores = cell_scores(queries, keys_of(blob, self.skew), None, self.skew.head_dim)
            else:
                proj = self.skew.proj if cfg.policy == "infinigen" else self.skew.proj_noskew
                if pkeys is None:  # normally saved beside the state, so not on the request path
                    pkeys = partial_keys(keys_of(blob, self.skew), proj)
                scores = cell_scores(queries, pkeys, proj, self.skew.head_dim)
            res.rehearsal_ms, res.select_ms = (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3
        t2 = time.perf_counter()
        mask = choose(sec.pos, cfg, *scores)
        res.bytes_restored = self.load(seq, blob, mask)
        res.restore_ms = (time.perf_counter() - t2) * 1e3
        res.kept, res.positions = int(mask.sum()), np.sort(sec.pos[mask])
        self.last_positions = res.positions
        return res
