"""The KV store against its own disk (issue 17): a foreign model of the same size, a corrupt or
foreign index, FIFOs, directories and symlinks where state files belong, planted temp files, ids
that are paths, lying headers, read-only and full disks. Every answer must equal the cold one."""

import hashlib
import logging
import os
import shutil
import sqlite3
import struct
import threading
import tracemalloc

import numpy as np
import pytest

from efim_local.engine.engine import CompletionRequest, Engine
from efim_local.kv import StateStore, StoreConfig, fingerprint, stateformat
from efim_local.kv.fingerprint import hash_file, model_fingerprint

from tests.helpers import SOURCES, fill_disk, remount_read_only, small_config, tmpfs

MB = 1 << 20


def req(doc, cur, path="a.py"):
    # No latency budget: the plan must not depend on how loaded the machine is.
    return CompletionRequest(doc, cur, path=path, max_tokens=6, layout="efim", max_prompt_ms=0)


def cold_ids(model, r):
    with Engine(small_config(n_slots=1), model) as e:
        return e.complete(r).token_ids


def disk_store(d, min_tokens=16):
    return StoreConfig(d, ram_mb=0, disk_mb=64, min_tokens=min_tokens)


def save_one(model, d, r):
    """Answer ``r`` with a store at ``d`` (ram_mb=0: the state goes straight to disk); its files."""
    with Engine(small_config(), model, store=disk_store(d)) as e:
        e.complete(r)
    return sorted((d / "states").glob("*.kv"))


def warnings(caplog, text):
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


# -- 6: a foreign model of the same size never restores ------------------------------------------

@pytest.fixture(scope="module")
def model_pair(tmp_path_factory):
    """Two GGUFs of equal size and metadata that differ only in one middle tensor, placed where the
    old fingerprint (first 8 MiB + last 1 MiB + size) did not look: two fine-tunes of one base."""
    import gguf

    from efim_local.training import tinymodel

    d = tmp_path_factory.mktemp("pair")
    a = tinymodel.build(d / "a.gguf", n_embd=256, n_ff=512, n_layer=8)
    size = a.stat().st_size
    reader = gguf.GGUFReader(str(a))
    lo, hi = 8 * MB, size - MB
    t = next(t for t in reader.tensors if "attn_k" in t.name and lo <= t.data_offset
             and t.data_offset + t.n_bytes <= hi)
    del reader
    b = d / "b.gguf"
    shutil.copy(a, b)
    with open(b, "r+b") as f:  # this layer's K projection, changed in place: same size, same header
        f.seek(t.data_offset)
        w = np.frombuffer(f.read(t.n_bytes), np.float32).copy()
        f.seek(t.data_offset)
        f.write((w[::-1] * 1.5).astype(np.float32).tobytes())

    def v1(p):  # the fingerprint before issue 17
        with open(p, "rb") as f:
            head = f.read(8 * MB)
            f.seek(size - MB)
            return hashlib.sha256(head + f.read() + size.to_bytes(8, "little")).digest()

    assert b.stat().st_size == size and v1(a) == v1(b)  # the old fingerprint could not tell them apart
    return a, b, t.name


def test_same_size_model_differing_in_a_middle_tensor_never_restores(tmp_path, model_pair):
    a, b, tensor = model_pair
    d = tmp_path / "kv"
    r = req(SOURCES[4][:1600], 800, path="m.py")
    assert save_one(a, d, r)
    assert model_fingerprint(a) != model_fingerprint(b), tensor
    with Engine(small_config(), b, store=disk_store(d)) as e:
        out = e.complete(r)
        assert out.cache_tier == "none", f"model B restored model A's state ({tensor} differs)"
        assert e.store.stats()["misses"]["model_changed"] == 1
    assert out.token_ids == cold_ids(b, r)


def test_fingerprint_is_cached_by_device_inode_size_and_mtime(tmp_path, tiny_model):
    m = tmp_path / "m.gguf"
    shutil.copy(tiny_model, m)
    cache = tmp_path / "kv"
    cache.mkdir()
    fp = model_fingerprint(m, cache)
    assert fp == hash_file(m) and (cache / fingerprint.CACHE_FILE).is_file()
    # Changed in place with its mtime put back: same (device, inode, size, mtime_ns), so a new
    # process (no in-memory cache) takes the store's cached value and does not read the file again.
    st = m.stat()
    with open(m, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(b"\xa5" * 64)
    os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns))
    fingerprint._fingerprint.cache_clear()
    assert model_fingerprint(m, cache) == fp != hash_file(m)
    os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: hashed again
    assert model_fingerprint(m, cache) == hash_file(m) != fp
    (cache / fingerprint.CACHE_FILE).write_text("{not json")  # a damaged cache is only a miss
    assert model_fingerprint(m, cache) == hash_file(m)


# -- 7: a corrupt, newer or foreign index is rebuilt from the state files ------------------------

@pytest.mark.parametrize("damage", ["garbage", "newer_schema", "foreign_schema", "directory", "fifo"])
def test_corrupt_index_is_rebuilt_from_the_state_files(tmp_path, tiny_model, damage, caplog):
    d = tmp_path / "kv"
    r = req(SOURCES[5][:2000], 1000, path="c.py")
    (f,) = save_one(tiny_model, d, r)
    idx = d / "index.db"
    if damage == "newer_schema":
        with sqlite3.connect(idx) as c:
            c.execute("PRAGMA user_version = 99")
    else:
        for p in d.glob("index.db*"):
            p.unlink()
        if damage == "garbage":
            idx.write_bytes(os.urandom(16384))
        elif damage == "foreign_schema":
            with sqlite3.connect(idx) as c:
                c.execute("CREATE TABLE states (name TEXT, value BLOB)")
                c.execute("PRAGMA user_version = 4")
        elif damage == "directory":
            idx.mkdir()
            (idx / "x").write_text("x")
        else:
            os.mkfifo(idx)
    with caplog.at_level(logging.WARNING, "efim.store"):
        with Engine(small_config(), tiny_model, store=disk_store(d)) as e:
            out = e.complete(r)
            assert [row["id"] for row in e.store.index.rows()] == [f.stem]
    assert out.cache_tier == "disk"  # the state file survived the index
    assert out.token_ids == cold_ids(tiny_model, r)
    assert len(warnings(caplog, "rebuilding it from the state files")) == 1


# -- 8, 15: only regular files are state files; nothing blocks, nothing outside is touched --------

@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_non_regular_state_file_is_dropped_without_blocking(tmp_path, tiny_model, kind):
    d = tmp_path / "kv"
    r = req(SOURCES[6][:2000], 1000, path="n.py")
    (f,) = save_one(tiny_model, d, r)
    f.unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(f"precious {kind}".encode())
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "directory":
        f.mkdir()
        (f / "inside").write_text("x")
    else:
        f.symlink_to(victim)
    got = {}

    def run():
        with Engine(small_config(), tiny_model, store=disk_store(d)) as e:
            got["out"] = e.complete(r)
            got["gone"] = not os.path.lexists(f)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), f"a {kind} in place of a state file blocked the engine"
    assert got["out"].cache_tier == "none" and got["gone"]
    assert got["out"].token_ids == cold_ids(tiny_model, r)
    assert victim.read_bytes() == f"precious {kind}".encode()


def test_gc_repairs_non_regular_files_and_startup_survives_them(tmp_path):
    d = tmp_path / "kv"
    store = StateStore(disk_store(d), b"m" * 32, b"l" * 32, {})
    store.close()
    states = d / "states"
    sid = "ab" * 16
    (states / f"{sid}.kv").mkdir()  # a directory named like a state file
    (states / f"{sid}.kv" / "x").write_text("x")
    (states / f"{'cd' * 16}.kv.999999999.tmp").mkdir()  # and like a dead process's temp file
    os.mkfifo(states / f"{'ef' * 16}.pk")
    with StateStore(disk_store(d), b"m" * 32, b"l" * 32, {}) as store:  # the temp directory is removed
        assert not (states / f"{'cd' * 16}.kv.999999999.tmp").exists()
        out = store.gc()
    assert out["files_without_row"] == 2 and not list(states.iterdir())


def test_temp_file_never_follows_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    with StateStore(disk_store(tmp_path / "kv", min_tokens=4), b"m" * 32, b"l" * 32, {}) as store:
        toks = np.arange(100, dtype=np.int32)
        sid = store.state_id(toks)
        store.file_of(sid).with_name(f"{sid}.kv.{os.getpid()}.tmp").symlink_to(victim)
        assert store.put(toks, b"x" * 1000, "a.py") == sid
        assert stateformat.read(store.file_of(sid), b"m" * 32, b"l" * 32)[2] == b"x" * 1000
    assert victim.read_text() == "precious"


def test_index_ids_never_name_a_path(tmp_path):
    victim = tmp_path / "victim.kv"
    victim.write_text("precious")
    with StateStore(StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=1, min_tokens=4), b"m" * 32, b"l" * 32,
                    {}) as store:
        toks = np.arange(128, dtype=np.int32)
        row = {"id": "../../victim", "path": "v.py", "content_hash": "", "model": store._model_hex,
               "layout": store._layout_hex, "n_tokens": 128, "bytes": 2 * MB, "tier": "disk", "created": 0.0,
               "last_used": 0.0, "hits": 0, "owner": 0, "kept": 1.0}
        store.index.add(row, toks)
        assert store.lookup(toks).match is None  # the bad row is dropped, no path is built from it
        store.index.add(row, toks)
        store.put(np.arange(200, 300, dtype=np.int32), b"y" * 1000, "w.py")  # evicts the bad row
        assert store.index.get("../../victim") is None
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("disk_mb", [64, 4096])
def test_lying_header_costs_no_memory(tmp_path, disk_mb):
    """A header claiming 512 MiB in a sparse file of that size: over a 64 MB disk budget the file is
    refused by its size; under a 4 GB one the checksum runs over a map of the file, copying nothing."""
    cfg = StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=disk_mb, min_tokens=4)
    with StateStore(cfg, b"m" * 32, b"l" * 32, {}) as store:
        toks = np.arange(100, dtype=np.int32)
        sid = store.put(toks, b"z" * 5000, "a.py")
        f = store.file_of(sid)
        raw = bytearray(f.read_bytes())
        lie = 512 * MB
        struct.pack_into("<Q", raw, 16, lie)  # the payload length field
        f.write_bytes(bytes(raw))
        os.truncate(f, len(raw) - 5000 + lie)  # a sparse file whose size matches the lie
        tracemalloc.start()
        try:
            m = store.lookup(toks).match
            assert m is None or store.load(m, len(toks)) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * MB, f"reading a lying header allocated {peak / MB:.0f} MiB"
        assert not f.exists()  # dropped


# -- 9, 16: full and read-only disks cost the saves, never the answers ---------------------------

def test_full_disk_before_start_serves_without_the_store(tmp_path, tiny_model, caplog):
    r = req(SOURCES[7][:1500], 700)
    with tmpfs(tmp_path / "mnt") as mnt:
        fill_disk(mnt)
        with caplog.at_level(logging.WARNING, "efim.store"):
            with Engine(small_config(), tiny_model, store=disk_store(mnt / "kv")) as e:
                assert e.store is None
                out = e.complete(r)
    assert out.token_ids == cold_ids(tiny_model, r)
    assert len(warnings(caplog, "serving without saved states")) == 1


def test_full_disk_while_running_costs_only_the_saves(tmp_path, tiny_model, caplog):
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        with caplog.at_level(logging.WARNING, "efim.store"):
            with Engine(small_config(), tiny_model, store=disk_store(mnt / "kv")) as e:
                e.complete(req(SOURCES[0][:1500], 700, path="f0.py"))
                e.flush()
                fill_disk(mnt)
                for i in (1, 2, 3):
                    r = req(SOURCES[i][:1500], 700, path=f"f{i}.py")
                    out = e.complete(r)
                    e.flush()
                    assert out.token_ids == cold_ids(tiny_model, r)
                assert e.store.stats()["misses"]["no_state"] >= 3  # counts survive in memory
        assert 1 <= len(warnings(caplog, "serving on without it")) <= 4  # one per kind of failure


def test_read_only_store_restores_and_saves_nothing(tmp_path, tiny_model, caplog):
    r = req(SOURCES[8][:2000], 1000, path="ro.py")
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        d = mnt / "kv"
        save_one(tiny_model, d, r)
        os.chmod(d, 0o755)  # a mode to repair, on a disk that refuses chmod (EROFS)
        remount_read_only(mnt)
        before = sorted(p.name for p in d.rglob("*"))
        with caplog.at_level(logging.WARNING, "efim.store"):
            with Engine(small_config(), tiny_model, store=disk_store(d)) as e:
                assert e.store is not None and e.store.readonly
                out = e.complete(r)
                other = req(SOURCES[9][:2000], 1000, path="other.py")
                out2 = e.complete(other)
                e.flush()
                e.store.stats()
        assert sorted(p.name for p in d.rglob("*")) == before
    assert out.cache_tier == "disk" and out.token_ids == cold_ids(tiny_model, r)
    assert out2.token_ids == cold_ids(tiny_model, other)
    assert len(warnings(caplog, "read-only")) == 1
