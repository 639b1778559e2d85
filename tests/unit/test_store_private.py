"""The store's directory and index are private (issue 27, items 10 and 11): the store refuses a
directory another user could have prepared, and its index files are 0600. No model needed."""

import os
import stat

import pytest

from efim_local.errors import StoreError
from efim_local.kv import Hit, StateStore, StoreConfig

OTHER_UID = 65534  # nobody


def _open(d):
    return StateStore(StoreConfig(d), b"m" * 32, b"l" * 32, {})


def _mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    os.chmod(victim, 0o755)
    (victim / "precious").write_text("mine")
    return victim


def _untouched(victim):
    assert _mode(victim) == 0o755 and sorted(p.name for p in victim.iterdir()) == ["precious"]


def test_a_store_directory_that_is_a_symlink_is_refused(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "kv").symlink_to(victim)
    with pytest.raises(StoreError, match="not a directory .a symbolic link.*refusing"):
        _open(tmp_path / "kv")
    _untouched(victim)


def test_a_world_writable_parent_is_refused(tmp_path):
    parent = tmp_path / "efim"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(StoreError, match="writable by every user"):
        _open(parent / "kv")
    assert not (parent / "kv").exists()


def test_a_sticky_world_writable_parent_is_fine(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o1777)  # like /tmp
    with _open(parent / "kv") as store:
        assert store.stats()["tiers"]["disk"]["states"] == 0
    assert _mode(parent / "kv") == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory of another user")
@pytest.mark.parametrize("whose", ["parent", "store"])
def test_another_users_directory_is_refused(tmp_path, whose):
    parent = tmp_path / "efim"
    parent.mkdir()
    d = parent / "kv"
    if whose == "store":
        d.mkdir()
        os.chown(d, OTHER_UID, OTHER_UID)
    else:
        os.chmod(parent, 0o755)
        os.chown(parent, OTHER_UID, OTHER_UID)
    with pytest.raises(StoreError, match="belongs to another user"):
        _open(d)


def test_an_open_store_directory_of_ours_is_tightened(tmp_path):
    d = tmp_path / "kv"
    d.mkdir()
    os.chmod(d, 0o755)  # what a user's umask made
    with _open(d):
        pass
    assert _mode(d) == 0o700 and _mode(d / "states") == 0o700


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
