"""InfiniGen on real llama.cpp states: capture, calibration, partial keys, selection, sparse restore."""

import io

import numpy as np
import pytest

from efim_local.llama import Batch, Context, ContextParams, Model
from efim_local.kv.sparse import select, skew as skew_mod
from efim_local.kv.sparse.capture import QKCapture
from efim_local.kv.sparse.restore import SparseRestorer
from efim_local.kv.sparse.select import SelectConfig, Unsupported
from efim_local.kv import kvblob
from efim_local.kv.fingerprint import model_fingerprint

from tests.helpers import ROOT, small_config

TEXT = (ROOT / "efim_local" / "prompt" / "planner.py").read_text("utf-8") * 3


@pytest.fixture(scope="module", params=["llama", "swa"])
def calibrated(request, tiny_model, tiny_model_swa):
    path = tiny_model if request.param == "llama" else tiny_model_swa
    fp = model_fingerprint(path).hex()
    return path, skew_mod.calibrate(path, TEXT, fp, n_tokens=400), fp


class Session:
    """A context with the capture callback, one slot, and a prefilled long state."""

    def __init__(self, path, n=300, type_k="f16"):
        self.cap = QKCapture()
        self.model = Model(path)
        self.ctx = Context(self.model, ContextParams(n_ctx_seq=1024, n_slots=1, n_batch=128, type_k=type_k),
                           self.cap.callback)
        self.batch = Batch(128)
        self.ids = self.model.tokenize(TEXT)[:n + 16]
        skew_mod.decode_captured(self.ctx, self.batch, self.cap, self.ids[:n], 0)
        self.state = kvblob.normalize(self.ctx.seq_state(0))
        self.n = n

    def logits_after(self, tail):
        self.batch.clear()
        for i, t in enumerate(tail):
            self.batch.add(t, self.n + i, 0, logits=i == len(tail) - 1)
        self.ctx.decode(self.batch)
        return np.array(self.ctx.logits(len(tail) - 1))

    def close(self):
        for h in (self.batch, self.ctx, self.model):
            h.close()


def test_capture_gives_the_post_rope_keys_the_cache_holds(calibrated):
    path, sk, _ = calibrated
    s = Session(path, type_k="f32")
    try:
        s.cap.start()
        s.ctx.seq_rm(0, 0, -1)
        skew_mod.decode_captured(s.ctx, s.batch, s.cap, s.ids[:s.n], 0)
        q, k = s.cap.stop()
        blob = kvblob.parse_normalized(kvblob.normalize(s.ctx.seq_state(0)))
        sec = blob.sections[0]
        for j, il in enumerate(sk.layers_of(0)):
            t, row, off = sec.k_layers[j]
            K = np.frombuffer(blob.data, np.float32, sec.cell_count * row // 4, off).reshape(sec.cell_count, -1)
            assert np.array_equal(k[il][sec.pos].reshape(sec.cell_count, -1), K)
        assert q[0].shape == (s.n, sk.n_head, sk.head_dim)
    finally:
        s.close()


def test_skew_is_orthogonal_and_exact_at_full_rank(calibrated, tmp_path):
    path, sk, fp = calibrated
    for il in range(sk.proj.shape[0]):
        for h in range(sk.n_kv):
            a = sk.proj[il, h]
            assert np.allclose(a.T @ a, np.eye(sk.r), atol=1e-5)
    # With every column kept, skewed scores equal exact ones: (QA)(KA)^T = QK^T.
    s = Session(path)
    try:
        s.cap.start()
        s.ctx.seq_rm(0, 0, -1)
        skew_mod.decode_captured(s.ctx, s.batch, s.cap, s.ids[:s.n], 0)
        q, k = s.cap.stop()
    finally:
        s.close()
    full, _ = skew_mod.compute(q, k, ratio=1.0)
    keys = {il: k[il] for il in sk.layers_of(0)}
    exact = select.cell_scores({il: q[il][-4:] for il in keys}, keys, None, sk.head_dim)
    skewed = select.cell_scores({il: q[il][-4:] for il in keys}, select.partial_keys(keys, full), full, sk.head_dim)
    assert np.allclose(exact.rel, skewed.rel, atol=2e-2) and np.allclose(exact.mass, skewed.mass, atol=2e-3)
    # Partial keys take r/d of the keys' size.
    pk = select.partial_keys(keys, sk.proj)
    assert all(v.shape[-1] == sk.r for v in pk.values()) and sk.r <= 0.2 * sk.head_dim + 1


def test_sidecar_round_trip_and_rejections(calibrated, tmp_path):
    _, sk, fp = calibrated
    p = skew_mod.sidecar_path(tmp_path, fp)
    sk.save(p)
    back = skew_mod.Skew.load(p, fp)
    assert np.array_equal(back.proj, sk.proj) and np.array_equal(back.section_layers, sk.section_layers)
    with pytest.raises(skew_mod.SkewError, match="another model"):
        skew_mod.Skew.load(p, "0" * 64)
    bad = tmp_path / "bad.npz"
    np.savez(bad, version=np.int32(1), fingerprint=np.array(fp), dims=np.array([4, 2, 8], np.int32),
             proj=np.zeros((2, 2, 8, 3), np.float32), proj_noskew=np.zeros((2, 2, 8, 3), np.float32),
             section_layers=np.array([[0, 7]], np.int32))
    with pytest.raises(skew_mod.SkewError, match="inconsistent"):
        skew_mod.Skew.load(bad, fp)
    evil = tmp_path / "evil.npz"
    np.savez(evil, version=np.int32(1), fingerprint=np.array([{"x": 1}], dtype=object))
    with pytest.raises(skew_mod.SkewError):
        skew_mod.Skew.load(evil, fp)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(skew_mod.SkewError):
        skew_mod.Skew.load(tmp_path / "junk.npz", fp)


def test_sparse_restore_holds_exactly_the_chosen_positions(calibrated):
    path, sk, _ = calibrated
    s = Session(path)
    try:
        tail = s.ids[s.n:s.n + 8]
        r = SparseRestorer(s.ctx, s.batch, s.cap, sk, n_stream=1, n_swa=s.model.n_swa)
        res = r.restore(0, s.state, tail, SelectConfig(budget=0.25, recent=16))
        assert res.kept == len(res.positions) <= round(0.25 * res.cells) and res.bytes_restored < res.bytes_full
        held = kvblob.parse_normalized(kvblob.normalize(s.ctx.seq_state(0)))
        assert np.array_equal(np.sort(held.sections[0].pos), res.positions)
        if s.model.n_swa:  # the sliding-window layers keep what they can still see
            assert held.sections[1].pos.min() > s.n - 1 - s.model.n_swa
        assert np.isfinite(s.logits_after(tail)).all()
    finally:
        s.close()


def test_full_selection_reproduces_the_full_state_exactly(calibrated):
    path, sk, _ = calibrated
    s = Session(path)
    try:
        tail = s.ids[s.n:s.n + 8]
        s.ctx.seq_rm(0, 0, -1)  # the reference: the saved state restored as it is
        s.ctx.set_seq_state(0, kvblob.wrap(s.state, 1))
        want = s.logits_after(tail)
        s.ctx.seq_rm(0, 0, -1)
        r = SparseRestorer(s.ctx, s.batch, s.cap, sk, n_stream=1, n_swa=s.model.n_swa)
        res = r.restore(0, s.state, tail, SelectConfig(budget=1.0))
        assert res.kept == res.cells
        assert np.array_equal(s.logits_after(tail), want)
    finally:
        s.close()


def test_unsupported_kv_type_falls_back(calibrated):
    path, sk, _ = calibrated
    s = Session(path, type_k="q8_0")
    try:
        with pytest.raises(Unsupported) as e:
            select.keys_of(kvblob.parse_normalized(s.state), sk)
        assert e.value.reason == "kv_type"
    finally:
        s.close()


def test_engine_sparse_restore_is_opt_in_reported_and_never_saved(calibrated, tmp_path, monkeypatch):
    from efim_local.engine.engine import CompletionRequest, Engine
    from efim_local.kv import StoreConfig

    path, sk, fp = calibrated
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sk.save(skew_mod.sidecar_path(skew_mod.default_dir(), fp))
    sc = StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=64, min_tokens=16)
    cfg = small_config(sparse_budget=0.25, sparse_min_tokens=64, max_middle_tokens=64)
    doc = TEXT[:1500]
    first = CompletionRequest(doc, 1200, path="a.py", max_tokens=4)
    typed = CompletionRequest(doc[:1200] + "x = 1\n" + doc[1200:], 1206, path="a.py", max_tokens=6)
    with Engine(cfg, path, store=sc) as e:
        e.complete(first)
        e.flush()
        e.store.spill()
        sid = next(p for p in (tmp_path / "kv" / "states").glob("*.kv"))
        assert sid.with_suffix(".pk").exists(), "partial keys are saved beside the state"
        for s in e.slots.slots:  # the slot was evicted: the state must come from disk
            e.ctx.seq_rm(s.seq, 0, -1)
            s.reset()
        out = e.complete(typed)
        rep = out.sparse
        assert rep and "fallback" not in rep, rep
        assert rep["kept"] < rep["cells"] and rep["bytes_restored"] < rep["bytes_full"]
        assert rep["partial_keys"] == "saved" and out.cache_tier == "disk"
        slot = e.slots.slots[out.slot]
        assert slot.sparse and not slot.dirty
        # An exact request never reuses approximate KV: it equals a cold run.
        exact = e.complete(CompletionRequest(typed.text, typed.cursor, path="a.py", max_tokens=6, sparse=False))
        assert exact.sparse is None and not e.slots.slots[exact.slot].sparse
        cold = e.run(e.plan(typed).tokens, typed.how, cold=True)
        assert exact.token_ids == cold.token_ids
    with Engine(small_config(), path, store=sc) as e:  # off by default: full restore
        assert e.complete(typed).sparse is None


def test_disk_pressure_shrinks_long_states_before_evicting(calibrated, tmp_path, monkeypatch):
    from efim_local.engine.engine import CompletionRequest, Engine
    from efim_local.kv import StoreConfig

    path, sk, fp = calibrated
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sk.save(skew_mod.sidecar_path(skew_mod.default_dir(), fp))
    cfg = small_config(sparse_budget=0.25, sparse_min_tokens=64, sparse_shrink_to=0.3, max_middle_tokens=64)
    a = CompletionRequest(TEXT[:1500], 1200, path="a.py", max_tokens=2)
    b = CompletionRequest(TEXT[3000:4500], 1200, path="b.py", max_tokens=2)
    big = StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=64, min_tokens=16, shrink_to=0.3, shrink_min_tokens=64)
    with Engine(cfg, path, store=big) as e:
        e.complete(a)
        e.flush()
        row_a = e.store.index.rows("disk")[0]
    # Room for about one and a half states: saving b must shrink a (not evict it).
    tight = StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=row_a["bytes"] * 1.6 / (1 << 20), min_tokens=16,
                        shrink_to=0.3, shrink_min_tokens=64)
    with Engine(cfg, path, store=tight) as e:
        e.complete(b)
        e.flush()
        rows = {r["path"]: r for r in e.store.index.rows("disk")}
        assert set(rows) == {"a.py", "b.py"}
        assert rows["a.py"]["kept"] == 0.3 and rows["a.py"]["bytes"] < 0.5 * row_a["bytes"]
        assert sum(r["bytes"] for r in rows.values()) <= tight.disk_mb * (1 << 20)
        toks = np.asarray(e.plan(a).tokens, np.int32)
        # The shrunk state keeps its id and serves sparse restores only: an exact lookup misses it.
        assert e.store.lookup(toks, "a.py").match is None
        shrunk = e.store.lookup(toks, "a.py", shrunk=True).match
        assert shrunk.id == row_a["id"] and shrunk.kept == 0.3 and shrunk.n == len(shrunk.tokens) > 64
        for s in e.slots.slots:
            e.ctx.seq_rm(s.seq, 0, -1)
            s.reset()
        out = e.complete(a)  # sparse is on: the shrunk state serves, and says so
        assert out.sparse and out.sparse.get("shrunk_state") is True, out.sparse
        exact = e.complete(CompletionRequest(a.text, a.cursor, path="a.py", max_tokens=2, sparse=False))
        assert exact.sparse is None and exact.cache_tier != "disk"


def test_support_matrix_reasons(tiny_model, tmp_path, monkeypatch):
    from efim_local.engine.engine import CompletionRequest, Engine
    from efim_local.kv.sparse.sparse import SparseMode
    from efim_local.kv import StoreConfig

    class OtherArch:  # what SparseMode reads of a model
        n_swa = 0

        def meta(self, key):
            return "qwen2"

    assert SparseMode(OtherArch(), tiny_model, SelectConfig(), 64).reason == "unsupported_arch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))  # no sidecar: not calibrated
    sc = StoreConfig(tmp_path / "kv", ram_mb=64, disk_mb=64, min_tokens=16)
    with Engine(small_config(sparse_budget=0.2, sparse_min_tokens=16), tiny_model, store=sc) as e:
        assert e.status()["sparse_restore"] == "unavailable: not_calibrated"
        req = CompletionRequest(TEXT[:1200], 1000, path="a.py", max_tokens=2)
        e.complete(req)
        e.flush()
        for s in e.slots.slots:
            e.ctx.seq_rm(s.seq, 0, -1)
            s.reset()
        out = e.complete(req)
        assert out.sparse == {"fallback": "not_calibrated"} and out.cache_tier == "ram"


def test_shrink_keeps_the_most_selected_cells(calibrated, tmp_path):
    from efim_local.kv.sparse.sparse import SparseMode
    from efim_local.kv import StateStore, StoreConfig

    path, sk, fp = calibrated
    sk.save(skew_mod.sidecar_path(tmp_path, fp))
    s = Session(path)
    try:
        mode = SparseMode(s.model, path, SelectConfig(sinks=4, recent=16), 64, skew_dir=tmp_path)
        store = StateStore(StoreConfig(tmp_path / "kv"), b"m", b"l", {})
        store.note_selection("x", np.arange(100, 130))
        store.note_selection("x", np.arange(120, 140))
        assert store.selected["x"][125] == 2 and store.selected["x"][99] == 0
        out, partial = mode.shrink(s.state, mode.partial_npz(s.state), store.selected["x"], 0.3)
        kept = kvblob.parse_normalized(out).sections[0].pos
        assert set(range(100, 140)) <= set(kept.tolist()) and len(kept) == round(0.3 * s.n)
        assert set(range(4)) <= set(kept.tolist()) and set(range(s.n - 16, s.n)) <= set(kept.tolist())
        assert np.array_equal(np.load(io.BytesIO(partial))["pos"], kept)
        store.close()
    finally:
        s.close()
