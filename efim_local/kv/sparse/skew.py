"""Skewing matrices (InfiniGen §4.2) from a calibration run, saved as a sidecar npz.

Per layer and KV head: the SVD of the group's post-RoPE queries, Q = U Σ Vᵀ, gives an orthogonal
A = V, so (QA)(KA)ᵀ = QKᵀ. After skewing a few columns carry most of the magnitude; we order them
by σq·σk (σq from Σ, σk the norm of K's projection) and keep the top ``ratio`` of them. Only the
kept columns of A are stored: the partial query is Q·A_r and the partial key K·A_r.

The no-skew ablation keeps the same number of original dimensions, chosen by |Q|·|K| column norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import StoreError
from ...llama import Batch, Context, ContextParams, Model
from .. import kvblob
from .capture import QKCapture

VERSION = 1


class SkewError(StoreError):
    """The sidecar is missing, foreign or malformed."""


@dataclass
class Skew:
    fingerprint: str
    n_head: int
    n_kv: int
    head_dim: int
    proj: np.ndarray  # float32 [n_layer, n_kv, head_dim, r]: skewed partial projection
    proj_noskew: np.ndarray  # float32 [n_layer, n_kv, head_dim, r]: original dimensions
    section_layers: np.ndarray  # int32 [n_sections, max_layers]: model layer of each state layer, -1 pad

    @property
    def r(self) -> int:
        return self.proj.shape[-1]

    def layers_of(self, section: int) -> list[int]:
        return [int(x) for x in self.section_layers[section] if x >= 0]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, version=np.int32(VERSION), fingerprint=np.array(self.fingerprint),
                 dims=np.array([self.n_head, self.n_kv, self.head_dim], np.int32),
                 proj=self.proj, proj_noskew=self.proj_noskew, section_layers=self.section_layers)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, fingerprint: str) -> "Skew":
        """Load and check a sidecar; raises :class:`SkewError` for a foreign or bad one."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["version"]) != VERSION or str(z["fingerprint"]) != fingerprint:
                    raise SkewError(f"{path}: made for another model or version")
                n_head, n_kv, d = (int(x) for x in z["dims"])
                proj, noskew, sl = z["proj"], z["proj_noskew"], z["section_layers"]
        except (OSError, KeyError, ValueError) as e:
            if isinstance(e, SkewError):
                raise
            raise SkewError(f"{path}: {e}") from None
        n_layer = proj.shape[0] if proj.ndim == 4 else 0
        if (proj.ndim != 4 or proj.shape[1:3] != (n_kv, d) or noskew.shape != proj.shape
                or not 0 < proj.shape[3] <= d or n_kv <= 0 or n_head % n_kv or n_layer > kvblob.MAX_LAYERS
                or sl.ndim != 2 or sl.shape[0] > 2 or (sl >= n_layer).any()):
            raise SkewError(f"{path}: inconsistent shapes")
        return cls(fingerprint, n_head, n_kv, d, proj.astype(np.float32), noskew.astype(np.float32),
                   sl.astype(np.int32))


def sidecar_path(directory: Path, fingerprint: str) -> Path:
    """Sidecar files are named by the model fingerprint, never by a user path."""
    return directory / f"{fingerprint[:32]}.skew.npz"


def decode_captured(ctx: Context, batch: Batch, cap: QKCapture, tokens, seq: int, pos0: int = 0) -> None:
    """Decode ``tokens`` at positions pos0.. in ubatch-sized pieces, recording Q and K."""
    n = ctx.n_batch
    for s in range(0, len(tokens), n):
        batch.clear()
        for i, t in enumerate(tokens[s:s + n]):
            batch.add(int(t), pos0 + s + i, seq, logits=False)
        ctx.decode(batch)
        cap.end_decode()


def compute(q: dict[int, np.ndarray], k: dict[int, np.ndarray], ratio: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(skewed, no-skew) partial projections from captured Q [T, H, d] and K [T, Hkv, d] per layer."""
    n_layer = len(q)
    _, n_head, d = q[0].shape
    n_kv = k[0].shape[1]
    g = n_head // n_kv
    r = max(1, math.ceil(ratio * d))
    proj = np.zeros((n_layer, n_kv, d, r), np.float32)
    noskew = np.zeros_like(proj)
    for il in range(n_layer):
        for h in range(n_kv):
            qg = q[il][:, h * g:(h + 1) * g, :].reshape(-1, d).astype(np.float64)
            kh = k[il][:, h, :].astype(np.float64)
            _, s, vt = np.linalg.svd(qg, full_matrices=False)
            a = vt.T  # columns: right singular vectors, orthonormal
            sk = np.linalg.norm(kh @ a, axis=0)
            cols = np.argsort(-(s * sk))[:r]
            proj[il, h] = a[:, cols]
            dims = np.argsort(-(np.linalg.norm(qg, axis=0) * np.linalg.norm(kh, axis=0)))[:r]
            noskew[il, h] = np.eye(d)[:, dims]
    return proj, noskew


def section_layers(blob: bytes, k: dict[int, np.ndarray]) -> np.ndarray:
    """Which model layer each layer of each cache section holds, by matching the state's K rows
    against the captured keys (sliding-window models keep their global layers in section 0)."""
    secs = kvblob.parse_normalized(blob).sections
    rows = []
    for sec in secs:
        found = []
        if sec is not None:
            for t, row, off in sec.k_layers:
                dt = {0: np.float32, 1: np.float16}.get(t)
                if dt is None:
                    raise SkewError(f"KV type {t} is not supported for calibration (use f16 or f32)")
                K = np.frombuffer(blob, dt, sec.cell_count * row // np.dtype(dt).itemsize, off)
                K = K.reshape(sec.cell_count, -1).astype(np.float32)
                best = min(k, key=lambda il: float(np.abs(k[il][sec.pos].reshape(len(sec.pos), -1) - K).max()))
                found.append(best)
        rows.append(found)
    width = max(1, max(len(r) for r in rows))
    return np.array([r + [-1] * (width - len(r)) for r in rows], np.int32)


def calibrate(model_path: Path, text: str, fingerprint: str, n_tokens: int = 2048, ratio: float = 0.2,
              threads: int = 0) -> Skew:
    """Run ``text`` (its first ``n_tokens`` tokens) through llama.cpp and build the skew."""
    cap = QKCapture()
    params = ContextParams(n_ctx_seq=n_tokens + 16, n_slots=1, n_batch=512, n_threads=threads)
    with Model(model_path) as m, Context(m, params, cap.callback) as ctx, Batch(ctx.n_batch) as batch:
        ids = m.tokenize(text)[:n_tokens]
        if len(ids) < 64:
            raise SkewError("calibration text is too short")
        cap.start()
        decode_captured(ctx, batch, cap, ids, 0)
        q, k = cap.stop()
        if not q or set(q) != set(k):
            raise SkewError("no Qcur/Kcur tensors captured: unsupported architecture")
        blob = kvblob.normalize(ctx.seq_state(0))
    proj, noskew = compute(q, k, ratio)
    return Skew(fingerprint, q[0].shape[1], k[0].shape[1], q[0].shape[2], proj, noskew, section_layers(blob, k))


def default_dir() -> Path:
    from ...config import cache_home

    return cache_home() / "infinigen"
