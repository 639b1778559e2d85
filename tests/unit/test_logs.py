"""The daemon's logging: efim's own messages only (debug ones with -v), and request statistics."""

import logging

import pytest

from efim_local.daemon import logs


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("efim").level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("efim").setLevel(saved[2])


@pytest.mark.parametrize("verbose", [False, True])
def test_only_efim_logs_below_warning(restore_logging, verbose):
    """Before: `serve -v` set the root logger to DEBUG, so the file watcher's debug chatter filled the log."""
    logs.setup(verbose)
    assert logging.getLogger("efim.daemon").isEnabledFor(logging.INFO)
    assert logging.getLogger("efim.daemon").isEnabledFor(logging.DEBUG) is verbose
    for other in ("watchdog.observers.inotify_buffer", "urllib3", "asyncio"):
        assert not logging.getLogger(other).isEnabledFor(logging.INFO)
        assert logging.getLogger(other).isEnabledFor(logging.WARNING)


def test_request_stats():
    st = logs.RequestStats("efim", "why")
    for cached, ms in [(0, 30.0), (90, 2.0), (95, 3.0), (0, 50.0)]:
        st.record("/a.py" if ms < 40 else "/b.py", {"tokens": {"prompt": 100, "cached": cached, "evaluated": 100 - cached,
                                                               "generated": 4},
                                                    "timings": {"total_ms": ms}, "layout": "efim", "cache_tier": "slot",
                                                    "reanchor": None})
    s = st.summary()
    assert (s["window"], s["p50_ms"], s["p95_ms"]) == (4, 3.0, 50.0)
    assert s["files"]["/a.py"] == {"requests": 3, "hit_rate": 0.667, "cached_tokens": 185, "prompt_tokens": 300}
    assert s["files"]["/b.py"]["hit_rate"] == 0.0
    assert logs.percentile([], 50) is None and logs.percentile([5.0], 95) == 5.0


def test_percentile_is_nearest_rank():
    xs = [float(i) for i in range(1, 7)]  # 6 values: the 50th percentile is the 3rd
    assert [logs.percentile(xs, q) for q in (50, 95, 100, 1)] == [3.0, 6.0, 6.0, 1.0]


def test_log_file_rotates_and_is_private(tmp_path, monkeypatch):
    """The daemon's log handler: rotated by size, files 0600, never through a symbolic link."""
    import logging
    import os

    from efim_local.daemon import logs
    from efim_local.errors import ConfigError

    monkeypatch.setattr(logs, "MAX_BYTES", 2000)
    path = tmp_path / "daemon.log"
    h = logs.PrivateRotatingFileHandler(path)
    rec = logging.LogRecord("efim.daemon", logging.INFO, __file__, 1, "x" * 100, None, None)
    for _ in range(60):
        h.emit(rec)
    h.close()
    assert (tmp_path / "daemon.log.1").exists() and path.stat().st_size <= 2000
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.glob("daemon.log*")} == {"0o600"}
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "linked.log"
    os.symlink(target, link)
    with pytest.raises(ConfigError):
        logs.PrivateRotatingFileHandler(link)
