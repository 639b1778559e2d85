"""Watched roots cost inotify watches (issue 27 item 11): / and the home directory are refused, and
so is a root with too many directories; the total over named roots stays bounded. Links out of a
root and special files are never watched (issue 17)."""

import os
import time
from pathlib import Path

from efim_local.daemon import watcher as W
from efim_local.daemon.watcher import Watcher, interesting


def test_wide_roots_are_refused_before_anything_is_watched(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for root in (Path("/"), tmp_path / "home"):
        why, _ = W.refusal(root)
        assert why and "too wide" in why
    for k in range(6):
        (tmp_path / "proj" / f"d{k}").mkdir(parents=True)
    assert W.refusal(tmp_path / "proj", limit=7) == (None, 7)
    why, n = W.refusal(tmp_path / "proj", limit=6)
    assert "more than 6 directories" in why and n == 7
    w = W.Watcher(lambda p: None)
    try:
        w.watch("/")
        w.watch(str(tmp_path / "home"))
        assert w.roots() == []
        w.watch(str(tmp_path / "proj"))
        assert w.roots() == [str((tmp_path / "proj").resolve())]
    finally:
        w.stop()


def test_roots_named_by_editors_share_a_budget_of_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "MAX_WATCHES", 10)
    for name in ("a", "b", "c"):
        for k in range(3):
            (tmp_path / name / f"d{k}").mkdir(parents=True)  # 4 directories each
    w = W.Watcher(lambda p: None)
    try:
        for name in ("a", "b", "c"):
            w.watch(str(tmp_path / name))
        assert w.roots() == [str(tmp_path / "b"), str(tmp_path / "c")]  # the oldest made room
    finally:
        w.stop()


# -- links, special files, least recently named roots (issue 17 items 14, 19) ----------------------
def test_watcher_ignores_links_out_of_the_root_and_special_files(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (outside / "key.py").write_text("secret = 1\n")
    (root / "mine.py").write_text("x = 1\n")
    (root / "out.py").symlink_to(outside / "key.py")
    (root / "in.py").symlink_to(root / "mine.py")
    os.mkfifo(root / "pipe.py")
    r = str(root.resolve())
    assert interesting(str(root / "mine.py"), r) and interesting(str(root / "in.py"), r)
    assert not interesting(str(root / "out.py"), r)
    t0 = time.monotonic()
    assert not interesting(str(root / "pipe.py"), r) and time.monotonic() - t0 < 1  # never blocks


def test_watched_roots_are_bounded_least_recently_named_first(tmp_path):
    w = Watcher(lambda p: None, [str(tmp_path)], limit=3)
    for k in range(6):
        (tmp_path / f"r{k}").mkdir()
        w.watch(str(tmp_path / f"r{k}"))
    w.watch(str(tmp_path / "r3"))  # named again: the most recent
    (tmp_path / "r6").mkdir()
    w.watch(str(tmp_path / "r6"))
    names = {os.path.basename(r) for r in w.roots()}
    assert names == {tmp_path.name, "r3", "r5", "r6"}  # the --watch root is never dropped


def test_a_renamed_or_deleted_file_reports_its_old_path_too(tmp_path):
    """Repository context (issue 25) forgets a file that was renamed away or deleted."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "util.py").write_text("def clamp(x):\n    return x\n")
    (root / "gone.py").write_text("x = 1\n")
    seen: list[str] = []
    w = Watcher(seen.append, [str(root)])
    w.start()
    try:
        (root / "util.py").rename(root / "tools.py")
        (root / "gone.py").unlink()
        r = root.resolve()
        want = {str(r / "util.py"), str(r / "tools.py"), str(r / "gone.py")}
        deadline = time.monotonic() + 10
        while not want <= {os.path.realpath(os.path.dirname(p)) + "/" + os.path.basename(p) for p in seen}:
            assert time.monotonic() < deadline, seen
            time.sleep(0.02)
    finally:
        w.stop()


def test_efims_own_directories_are_not_the_workspaces(tmp_path, monkeypatch):
    """A workspace that holds efim's own state (its log, its saved states, a ``state_dir`` of the
    config's): their writes, renames and deletions never reach the callback; the workspace's do."""
    root = tmp_path / "ws"
    for d in ("state/efim", "store", "src"):
        (root / d).mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    from efim_local.daemon.paths import own_dirs

    seen: list[str] = []
    w = Watcher(seen.append, [str(root)], ignored=own_dirs())
    w.ignore(root / "store")  # (the engine's state store, known once it is loaded)
    w.start()
    try:
        log = root / "state" / "efim" / "daemon.log"
        for i in range(5):
            with log.open("a") as f:
                f.write(f"line {i}\n")
        (root / "store" / "a.json").write_text("{}")
        (root / "store" / "a.json").rename(root / "store" / "b.json")
        (root / "store" / "b.json").unlink()
        (root / "src" / "mod.py").write_text("x = 1\n")
        r = root.resolve()
        deadline = time.monotonic() + 10
        while str(r / "src" / "mod.py") not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # (events of the ignored writes, had they come, before the last one's)
    finally:
        w.stop()
    assert set(seen) == {str(r / "src" / "mod.py")}, seen
    assert not interesting(str(log), str(r), [os.path.realpath(root / "state" / "efim")])
