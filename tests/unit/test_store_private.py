"""The store's index files are private (issue 27, item 11). No model needed."""

import os
import stat

from efim_local.kv import Hit, StateStore, StoreConfig


def _open(d):
    return StateStore(StoreConfig(d), b"m" * 32, b"l" * 32, {})


def _mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_index_and_its_wal_and_shm_are_0600(tmp_path):
    old = os.umask(0o022)
    try:
        with _open(tmp_path / "kv") as store:
            store.record(Hit("ram"))  # a write: the WAL is in use
            store.flush_counts()
            files = [tmp_path / "kv" / n for n in ("index.db", "index.db-wal", "index.db-shm")]
            assert all(f.exists() for f in files)
            assert [oct(_mode(f)) for f in files] == ["0o600"] * 3
    finally:
        os.umask(old)


def test_an_index_left_0644_by_an_older_version_is_tightened(tmp_path):
    d = tmp_path / "kv"
    with _open(d):
        pass
    os.chmod(d / "index.db", 0o644)
    with _open(d):
        assert _mode(d / "index.db") == 0o600
