"""Watched roots cost inotify watches (issue 27 item 11): / and the home directory are refused, and
so is a root with too many directories; the total over named roots stays bounded."""

from pathlib import Path

from efim_local.daemon import watcher as W


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
