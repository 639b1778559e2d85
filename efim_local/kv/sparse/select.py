"""Which KV cells to keep under a budget: InfiniGen's speculation and the baselines.

All policies work on the state's first cache section (every layer of a llama model; the global
layers of a sliding-window model) and always keep the attention-sink tokens and a recent window.

- ``infinigen``: skewed partial queries against skewed partial keys; a cell qualifies when its
  score is at least max − α for some (layer, head, query) row; qualifying cells are taken by their
  speculated attention mass (softmax summed over the rows), largest first, up to the budget.
  llama.cpp keeps one cell set for all layers and heads, so the cells must be ranked across rows;
  ranking by mass rather than by the best single row gave +25 points of next-token agreement on
  the default model (docs/infinigen.md).
- ``noskew``: the same with the partial dimensions taken in the original basis (the ablation).
- ``oracle``: the same rule on exact attention scores of the same queries.
- ``recency``: the last cells only. ``sinks+recency``: StreamingLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...errors import Unsupported
from .. import kvblob
from .skew import Skew

POLICIES = ("infinigen", "noskew", "oracle", "recency", "sinks+recency")
KV_DTYPES = {0: np.float32, 1: np.float16}  # ggml types whose rows we can read




@dataclass(frozen=True)
class SelectConfig:
    budget: float = 0.2  # fraction of the state's cells to keep
    alpha: float = 4.0  # keep scores ≥ max − α (InfiniGen uses 4-5)
    sinks: int = 4  # first positions always kept
    recent: int = 64  # last positions always kept
    queries: int = 8  # last tail tokens rehearsed; their queries stand for the whole tail
    policy: str = "infinigen"


def keys_of(blob: kvblob.Blob, skew: Skew) -> dict[int, np.ndarray]:
    """Full post-RoPE keys [cells, n_kv, head_dim] per model layer of the first section."""
    sec = blob.sections[0]
    if sec is None:
        raise Unsupported("empty", "the state holds no cells")
    layers = skew.layers_of(0)
    if len(layers) != len(sec.k_layers):
        raise Unsupported("layout", "the state's layers do not match the calibration")
    out = {}
    for il, (t, row, off) in zip(layers, sec.k_layers):
        dt = KV_DTYPES.get(t)
        if dt is None:
            raise Unsupported("kv_type", f"KV type {t} is not f16/f32: full restore")
        if row != skew.n_kv * skew.head_dim * np.dtype(dt).itemsize:
            raise Unsupported("layout", "key rows do not match the calibration")
        out[il] = np.frombuffer(blob.data, dt, sec.cell_count * skew.n_kv * skew.head_dim, off).reshape(
            sec.cell_count, skew.n_kv, skew.head_dim)
    return out


def partial_keys(keys: dict[int, np.ndarray], proj: np.ndarray) -> dict[int, np.ndarray]:
    """K·A_r per layer and KV head: [cells, n_kv, r] float16 (about r/d of K's size)."""
    return {il: np.einsum("ckd,kdr->ckr", k.astype(np.float32), proj[il], optimize=True).astype(np.float16)
            for il, k in keys.items()}


class CellScores(NamedTuple):
    rel: np.ndarray  # per cell: best (score − row max) over layers, heads and queries (≤ 0)
    mass: np.ndarray  # per cell: softmax attention summed over the same rows


def cell_scores(queries: dict[int, np.ndarray], keys: dict[int, np.ndarray], proj: np.ndarray | None,
                head_dim: int) -> CellScores:
    """Score every cell against every (layer, KV head, query) row.

    ``queries[il]`` is [T, n_head, d]; ``keys[il]`` is [cells, n_kv, r] (partial, with ``proj``)
    or [cells, n_kv, d] (exact, ``proj`` None).
    """
    rel = mass = None
    scale = 1.0 / math.sqrt(head_dim)
    for il, k in keys.items():
        q = queries[il].astype(np.float32)
        t, h, d = q.shape
        n_kv = k.shape[1]
        q = q.reshape(t, n_kv, h // n_kv, d).transpose(1, 0, 2, 3).reshape(n_kv, -1, d)  # [kv, T*g, d]
        if proj is not None:
            q = np.einsum("kxd,kdr->kxr", q, proj[il], optimize=True)
        s = np.einsum("kxr,ckr->kxc", q, k.astype(np.float32), optimize=True) * scale
        s -= s.max(axis=-1, keepdims=True)
        r = s.max(axis=(0, 1))
        np.exp(s, out=s)
        m = (s / s.sum(axis=-1, keepdims=True)).sum(axis=(0, 1))
        rel, mass = (r, m) if rel is None else (np.maximum(rel, r), mass + m)
    return CellScores(rel, mass)


def choose(pos: np.ndarray, cfg: SelectConfig, scores: np.ndarray | None = None,
           order_by: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask over cells: sinks + recent window + the best cells, ≤ the budget. A cell is a
    candidate when ``scores`` ≥ −α; candidates are taken by ``order_by`` (default: ``scores``),
    largest first."""
    n = len(pos)
    budget = max(1, int(round(cfg.budget * n)))
    order = np.argsort(pos, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)  # 0 = oldest
    keep = np.zeros(n, bool)
    if cfg.policy == "recency":
        keep[rank >= n - budget] = True
        return keep
    keep[rank < min(cfg.sinks, budget)] = True
    recent = budget - int(keep.sum()) if cfg.policy == "sinks+recency" else min(cfg.recent, budget - int(keep.sum()))
    if recent > 0:
        keep[rank >= n - recent] = True
    if cfg.policy == "sinks+recency" or scores is None:
        return keep
    room = budget - int(keep.sum())
    cand = np.flatnonzero(~keep & (scores >= -cfg.alpha))
    if room > 0 and len(cand):
        key = scores if order_by is None else order_by
        cand = cand[np.argsort(-key[cand], kind="stable")[:room]]
        keep[cand] = True
    return keep


def window_mask(pos: np.ndarray, n_swa: int) -> np.ndarray:
    """A sliding-window section keeps only what its layers can still see."""
    return pos > (pos.max() - n_swa) if len(pos) else np.zeros(0, bool)
