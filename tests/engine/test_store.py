"""The KV state store: blob rewriting, the file format, tiers, budgets, faults."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from efim_local.engine.engine import CompletionRequest, Engine
from efim_local.kv import StateStore, StoreConfig, kvblob

from tests.helpers import EDIT, ROOT, SOURCES, apply, small_config


@pytest.fixture(scope="module", params=["llama", "swa"])
def arch_model(request, tiny_model, tiny_model_swa):
    return tiny_model if request.param == "llama" else tiny_model_swa


@pytest.fixture(scope="module")
def reference(arch_model):
    """An engine that answers every request from an empty cache (``run(..., cold=True)``)."""
    with Engine(small_config(n_slots=1), arch_model) as e:
        yield e


def req(doc, cur, path="a.py", **kw):
    return CompletionRequest(doc, cur, path=path, max_tokens=kw.pop("max_tokens", 6), layout=kw.pop("layout", "efim"), **kw)


def cold_ids(model, r):
    with Engine(small_config(n_slots=1), model) as ref, Engine(small_config(n_slots=1), model) as planner:
        return ref.run(planner.plan(r).tokens, r.how, cold=True).token_ids


def store_files(d):
    return sorted(p.stem for p in (d / "states").glob("*.kv"))


# -- kvblob -------------------------------------------------------------------

def test_blob_roundtrip_truncate_and_subset(arch_model):
    with Engine(small_config(), arch_model) as e:
        out = e.complete(req(SOURCES[2][:3000], 1500))
        raw = e.ctx.seq_state(out.slot)
        norm = kvblob.normalize(raw)
        assert kvblob.wrap(norm, e.n_stream) == raw
        full = kvblob.positions(norm)[0]
        n = len(full)
        assert sorted(full) == list(range(n))
        cut = kvblob.positions(kvblob.truncate(norm, n - 100))[0]
        assert sorted(cut) == list(range(n - 100))
        # An arbitrary subset keeps exactly those positions (InfiniGen-style selection).
        keep = set(range(0, n, 3)) | set(range(n - 20, n))
        sub = kvblob.select(norm, lambda pos: np.isin(pos, list(keep)))
        e.ctx.set_seq_state(2, kvblob.wrap(sub, e.n_stream))
        assert sorted(kvblob.positions(kvblob.normalize(e.ctx.seq_state(2)))[0]) == sorted(keep)


def test_full_selection_restores_identical_logits(tiny_model):
    with Engine(small_config(), tiny_model) as e:
        out = e.complete(req(SOURCES[4][:2500], 1200))
        slot = e.slots.slots[out.slot]
        toks = slot.tokens
        e.ctx.seq_rm(slot.seq, len(toks) - 1, -1)
        norm = kvblob.normalize(e.ctx.seq_state(slot.seq))
        e.batch.clear(); e.batch.add(int(toks[-1]), len(toks) - 1, slot.seq, logits=True); e.ctx.decode(e.batch)
        want = e.ctx.logits(0)
        other = (slot.seq + 1) % 3
        e.ctx.seq_rm(other, 0, -1)
        e.ctx.set_seq_state(other, kvblob.wrap(kvblob.select(norm, lambda p: np.ones(len(p), bool)), e.n_stream))
        e.batch.clear(); e.batch.add(int(toks[-1]), len(toks) - 1, other, logits=True); e.ctx.decode(e.batch)
        assert np.array_equal(e.ctx.logits(0), want)


# -- exactness through the tiers ---------------------------------------------------

@settings(max_examples=4, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(srcs=st.lists(st.integers(0, len(SOURCES) - 1), min_size=2, max_size=3, unique=True),
       edits=st.lists(EDIT, min_size=1, max_size=4), layout=st.sampled_from(["efim", "fim"]),
       ram_mb=st.sampled_from([0.0, 0.5, 64.0]))
# Each tier mix, whatever the generator draws: disk only, a RAM tier too small to hold two
# states (evictions to disk), and RAM only until the restart.
@example(srcs=[0, 1], edits=[("type", "x = 1"), ("backspace", 2)], layout="efim", ram_mb=0.0)
@example(srcs=[2, 3, 4], edits=[("move", -120), ("insert_far", 50, "#\n")], layout="fim", ram_mb=0.5)
@example(srcs=[5, 6], edits=[("delete_far", 1000, 10), ("type", "\n")], layout="efim", ram_mb=64.0)
def test_restored_kv_is_token_identical(tmp_path_factory, arch_model, reference, srcs, edits, layout, ram_mb):
    """Files take turns in one slot, so every turn restores from RAM or disk (or a restart)."""
    d = tmp_path_factory.mktemp("kv")
    sc = StoreConfig(d, ram_mb=ram_mb, disk_mb=64, min_tokens=16)
    docs = {f"f{i}.py": [SOURCES[s][:1800], 900] for i, s in enumerate(srcs)}
    tiers = []
    for restart in range(2):
        with Engine(small_config(n_slots=1), arch_model, store=sc) as e:
            for edit in [("move", 0), *edits]:
                for path, dc in docs.items():
                    dc[0], dc[1] = apply(dc[0], dc[1], edit)
                    r = req(dc[0], dc[1], path=path, layout=layout)
                    out = e.complete(r)
                    tiers.append(out.cache_tier)
                    want = reference.run(e.plan(r).tokens, r.how, cold=True).token_ids
                    assert out.token_ids == want, (restart, edit, out.cache_tier)
                    e.flush()
    assert {"ram", "disk"} & set(tiers), tiers  # some turns were restored from the store
    if ram_mb == 0:
        assert "ram" not in tiers  # no RAM budget: states go straight to disk


# -- faults ----------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys, time
    from efim_local.engine.engine import CompletionRequest, Engine
    from efim_local.kv import StoreConfig, stateformat, index
    from tests.helpers import SOURCES, small_config
    model, d, where = sys.argv[1], sys.argv[2], sys.argv[3]
    def hang(*a, **k):
        print("SAVING", flush=True)
        time.sleep(60)
    e = Engine(small_config(), model, store=StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=16))
    if where == "fsync":  # (patched after the start: opening the store caches the model fingerprint)
        os.fsync = hang  # killed after writing the temp file, before the rename
    else:
        index.Index.add = hang  # killed after the rename, before the index row
    e.complete(CompletionRequest(SOURCES[3][:2000], 1000, path="k.py", max_tokens=4))
    e.flush()
""")


@pytest.mark.parametrize("where", ["fsync", "index"])
def test_kill_9_during_save(tmp_path, tiny_model, where):
    d = tmp_path / "kv"
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_model), str(d), where], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"SAVING\n", p.stderr.read()
    p.send_signal(signal.SIGKILL)
    p.wait()
    leftovers = list((d / "states").iterdir())
    assert leftovers  # a temp file, or a file with no index row
    r = req(SOURCES[3][:2000], 1000, path="k.py", max_tokens=4)
    with Engine(small_config(), tiny_model, store=StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=16)) as e:
        out = e.complete(r)
        assert out.cache_tier == "none"  # nothing half-written was used
        assert out.token_ids == cold_ids(tiny_model, r)
        e.store.gc()
        assert store_files(d) == sorted(row["id"] for row in e.store.index.rows("disk"))
        assert not list((d / "states").glob("*.tmp"))


def _one_saved_state(model, d, path="c.py", src=5):
    r = req(SOURCES[src][:2000], 1000, path=path)
    with Engine(small_config(), model, store=StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=16)) as e:
        e.complete(r)
    (f,) = (d / "states").glob("*.kv")
    return r, f


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "foreign_model", "garbage"])
def test_bad_state_files_are_dropped_never_restored(tmp_path, tiny_model, tiny_model_swa, damage, caplog):
    d = tmp_path / "kv"
    r, f = _one_saved_state(tiny_model, d)
    raw = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(raw[: len(raw) // 2])
    elif damage == "bitflip":
        b = bytearray(raw)
        b[-500] ^= 0x10
        f.write_bytes(bytes(b))
    elif damage == "garbage":
        f.write_bytes(os.urandom(len(raw)))
    else:
        _, other = _one_saved_state(tiny_model_swa, tmp_path / "other")
        shutil.copy(other, f)  # another model's state under this state's name
    with Engine(small_config(), tiny_model, store=StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=16)) as e:
        out = e.complete(r)
        assert out.cache_tier == "none"
        assert out.token_ids == cold_ids(tiny_model, r)
        assert not f.exists() or f.read_bytes() != raw  # the bad file was deleted (a new one may replace it)
        assert e.store.stats()["dropped"]


def test_model_changed_is_a_miss_reason(tmp_path, tiny_model, tiny_model_swa):
    d = tmp_path / "kv"
    r, _ = _one_saved_state(tiny_model, d)
    with Engine(small_config(), tiny_model_swa, store=StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=16)) as e:
        assert e.complete(r).cache_tier == "none"
        assert e.store.stats()["misses"]["model_changed"] == 1


# -- budgets -------------------------------------------------------------------------

def test_budgets_hold_and_index_matches_disk(tmp_path, tiny_model):
    d = tmp_path / "kv"
    sc = StoreConfig(d, ram_mb=0.4, disk_mb=0.9, min_tokens=16)
    with Engine(small_config(n_slots=2), tiny_model, store=sc) as e:
        for i in range(12):
            e.complete(req(SOURCES[i % len(SOURCES)][:1500], 700, path=f"b{i}.py"))
            e.flush()
            st = e.store
            assert st.ram_bytes() <= sc.ram_mb * (1 << 20)
            assert st.disk_bytes() <= sc.disk_mb * (1 << 20)
            assert sum(p.stat().st_size for p in (d / "states").glob("*.kv")) <= sc.disk_mb * (1 << 20)
            assert store_files(d) == sorted(r["id"] for r in st.index.rows("disk"))
        stats = e.store.stats()
        assert stats["evicted_disk"] > 0
    # An evicted file's next request reports why it missed.
    with Engine(small_config(n_slots=2), tiny_model, store=sc) as e:
        e.complete(req(SOURCES[0][:1500], 700, path="b0.py"))
        assert e.store.stats()["misses"]["evicted"] >= 1


def test_gc_reconciles_both_directions(tmp_path, tiny_model):
    d = tmp_path / "kv"
    _one_saved_state(tiny_model, d, "g1.py", 1)
    store = StateStore.admin(StoreConfig(d))
    (row,) = store.index.rows()
    (d / "states" / "0123abcd.kv").write_bytes(b"orphan")  # a file with no row
    store.index.add(dict(row, id="feedbeef", path="ghost.py"), np.arange(64, dtype=np.int32))  # a row with no file
    out = store.gc()
    assert out["files_without_row"] == 1 and out["rows_without_file"] == 1
    assert store_files(d) == sorted(r["id"] for r in store.index.rows("disk")) == [row["id"]]
    store.close()


def test_store_dir_permissions(tmp_path, tiny_model):
    d = tmp_path / "kv"
    _one_saved_state(tiny_model, d)
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in (d / "states").iterdir())
    # File names are hashes (32 lowercase hex digits), never user paths: the one state file's.
    assert [len(p.stem) == 32 and set(p.stem) <= set("0123456789abcdef") for p in (d / "states").iterdir()] == [True]
