"""The engine's opt-in sparse restore: what it needs from InfiniGen, in one object.

Off unless ``Config.sparse_budget`` > 0 (or a request asks for it). When on, restoring a saved
state of at least ``sparse_min_tokens`` tokens brings back only the cells InfiniGen speculates
matter; anything it cannot handle falls back to a full restore with a reason code:
``not_calibrated`` (no sidecar for this model), ``unsupported_arch``, ``kv_type``, ``layout``.
"""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import kvblob
from ..fingerprint import model_fingerprint
from .capture import QKCapture
from .restore import SparseRestorer
from .select import SelectConfig, Unsupported, choose, keys_of, partial_keys, window_mask
from .skew import Skew, SkewError, default_dir, sidecar_path

SUPPORTED_ARCHS = ("llama", "gemma3")  # gemma3: selection applies to the global layers' cells
MAX_PARTIAL_BYTES = 1 << 30


class SparseMode:
    def __init__(self, model, model_path: Path, cfg: SelectConfig, min_tokens: int, skew_dir: Path | None = None):
        self.cfg, self.min_tokens = cfg, min_tokens
        self.skew: Skew | None = None
        self.reason: str | None = None
        arch = model.meta("general.architecture") or ""
        if arch not in SUPPORTED_ARCHS:
            self.reason = "unsupported_arch"
        else:
            fp = model_fingerprint(model_path).hex()
            try:
                self.skew = Skew.load(sidecar_path(skew_dir or default_dir(), fp), fp)
            except SkewError:
                self.reason = "not_calibrated"
        self.cap = QKCapture() if self.skew is not None else None
        self.restorer: SparseRestorer | None = None
        self.n_swa = model.n_swa

    @property
    def eval_callback(self):
        return self.cap.callback if self.cap is not None else None

    def attach(self, ctx, batch, n_stream: int, n_swa: int) -> None:
        if self.skew is not None:
            self.restorer = SparseRestorer(ctx, batch, self.cap, self.skew, n_stream, n_swa)

    def partial_npz(self, payload: bytes) -> bytes | None:
        """The state's skewed partial keys (first section) as npz bytes, saved beside the state."""
        if self.skew is None:
            return None
        try:
            blob = kvblob.parse_normalized(payload)
            pk = partial_keys(keys_of(blob, self.skew), self.skew.proj)
        except (Unsupported, kvblob.BlobError):
            return None
        buf = io.BytesIO()
        np.savez(buf, pos=blob.sections[0].pos, **{f"L{il}": v for il, v in pk.items()})
        return buf.getvalue()

    def load_partial(self, data: bytes | None, pos: np.ndarray) -> dict[int, np.ndarray] | None:
        """Partial keys from npz bytes, checked against the state's positions; None if unusable."""
        if not data or len(data) > MAX_PARTIAL_BYTES or self.skew is None:
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                saved = z["pos"]
                layers = {il: z[f"L{il}"] for il in self.skew.layers_of(0)}
        except (OSError, KeyError, ValueError):
            return None
        # A truncated state keeps a prefix of the saved cells: match by position.
        idx = np.searchsorted(saved, pos) if np.all(np.diff(saved) > 0) else None
        if idx is None or (idx >= len(saved)).any() or not np.array_equal(saved[np.minimum(idx, len(saved) - 1)], pos):
            return None
        shape = (len(saved), self.skew.n_kv, self.skew.r)
        if any(v.shape != shape or v.dtype != np.float16 for v in layers.values()):
            return None
        return {il: v[idx] for il, v in layers.items()}

    def shrink(self, payload: bytes, partial: bytes | None, selected: np.ndarray | None, fraction: float):
        """InfiniGen's pool under pressure: keep the cells restores selected most often (ties: newer),
        plus sinks and the recent window. Returns (payload, partial) or None."""
        if self.skew is None:
            return None
        try:
            blob = kvblob.parse_normalized(payload)
        except kvblob.BlobError:
            return None
        sec = blob.sections[0]
        if sec is None:
            return None
        pos = sec.pos
        counts = np.zeros(len(pos))
        if selected is not None and len(selected):
            seen = pos < len(selected)
            counts[seen] = selected[pos[seen]]
        score = counts + pos / (2.0 * max(1, int(pos.max()) + 1))  # ties: newer first
        keep = choose(pos, SelectConfig(budget=fraction, alpha=np.inf, sinks=self.cfg.sinks,
                                        recent=self.cfg.recent), score)
        masks = [keep] + [None if s is None else (window_mask(s.pos, self.n_swa) if self.n_swa else
                                                  np.ones(s.cell_count, bool)) for s in blob.sections[1:]]
        out_partial = None
        pk = self.load_partial(partial, pos)
        if pk is not None:
            buf = io.BytesIO()
            np.savez(buf, pos=pos[keep], **{f"L{il}": v[keep] for il, v in pk.items()})
            out_partial = buf.getvalue()
        return kvblob.select_cells(blob, masks), out_partial

    def restore(self, seq: int, payload: bytes, tail, partial: bytes | None) -> dict:
        """Sparse-restore ``payload`` into ``seq``; the report for the response. Raises
        :class:`Unsupported` when the state cannot be handled (the caller restores it fully)."""
        if self.restorer is None:
            raise Unsupported(self.reason or "off", "sparse restore is not available")
        blob = kvblob.parse_normalized(payload)
        if blob.sections[0] is None:
            raise Unsupported("empty", "the state holds no cells")
        keys_of(blob, self.skew)  # raises Unsupported for other KV types or layouts
        pk = self.load_partial(partial, blob.sections[0].pos)
        res = self.restorer.restore(seq, payload, tail, self.cfg, pk)
        out = {k: v for k, v in asdict(res).items() if k != "positions"}
        out["partial_keys"] = "saved" if pk is not None else "computed"
        return out
