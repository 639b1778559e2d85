"""The daemon and the CLI on a bad disk (issue 17): a full disk before start and while running, a
corrupt index, config and environment errors. Always an answer or one line, never a traceback."""

import os
import sqlite3

import pytest

from tests.helpers import ROOT, Daemon, efim_cli, fill_disk, tmpfs

DOC = (ROOT / "efim_local" / "config.py").read_text()[:3000]


def _daemon(tmp_path, model, state_dir):
    d = Daemon(tmp_path / "d", model)
    with open(d.env["EFIM_CONFIG"], "a") as f:
        f.write(f'state_dir = "{state_dir}"\nram_mb = 0\nmin_state_tokens = 16\n')
    return d


def _complete(daemon, path, text=DOC):
    with daemon.client() as c:
        return c.call("complete", {"path": path, "text": text, "offset": len(text) // 2, "max_tokens": 4})


def _stop_with_cli(daemon):
    """`efim daemon stop` against this daemon's socket: it must work whatever the disk does."""
    r = efim_cli("daemon", "stop", env=dict(daemon.env, EFIM_SOCKET=str(daemon.sock)))
    assert r.returncode == 0, r.stderr.decode()
    daemon.proc.wait(30)
    err = daemon.proc.stderr.read().decode()
    assert "Traceback" not in err, err
    return err


@pytest.mark.parametrize("when", ["before_start", "while_running"])
def test_full_disk_stops_saves_not_completions(tmp_path, tiny_model, when):
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        if when == "before_start":
            fill_disk(mnt)
        d = _daemon(tmp_path, tiny_model, mnt / "kv").start()
        try:
            first = _complete(d, "a.py")
            if when == "while_running":
                fill_disk(mnt)
            answers = [_complete(d, f"f{i}.py", DOC[i * 200:]) for i in range(3)]
            assert all(isinstance(a["text"], str) for a in [first, *answers])
            with d.client() as c:
                st = c.call("status")
            assert st["served"] == 4 and st["errors"] == 0
            assert (st["store"] is None) == (when == "before_start")
            err = _stop_with_cli(d)
        finally:
            d.stop()
    assert d.proc.returncode == 0
    want = "serving without saved states" if when == "before_start" else "serving on without it"
    assert 1 <= err.count(want) <= 4, err  # one warning per kind of failure, not one per request


def test_corrupt_index_cli_and_daemon_recover(tmp_path, tiny_model):
    state = tmp_path / "kv"
    d = _daemon(tmp_path, tiny_model, state).start()
    try:
        _complete(d, "a.py")
    finally:
        d.stop()
    for p in state.glob("index.db*"):
        p.unlink()
    (state / "index.db").write_bytes(os.urandom(8192))
    env = dict(d.env)
    r = efim_cli("cache", "stats", "--json", env=env)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    assert b'"disk": {"states": 1' in r.stdout  # rebuilt from the state file
    assert r.stderr.decode().count("rebuilding it from the state files") == 1
    with sqlite3.connect(state / "index.db") as c:  # now a newer efim's index
        c.execute("PRAGMA user_version = 99")
    d2 = _daemon(tmp_path / "again", tiny_model, state).start()
    try:
        assert _complete(d2, "a.py")["cache_tier"] == "disk"
    finally:
        d2.stop()


@pytest.mark.parametrize("toml, message", [
    ('max_tokens = "lots"', "'max_tokens' must be an integer, not 'lots'"),
    ('store = "no"', "'store' must be bool, not 'no'"),
    ("ram_mb = nan", "'ram_mb' must be a finite number, not nan"),
    ("disk_mb = -1", "'disk_mb' must be in [0, 1073741824], not -1"),
    ("[context]\nn_slots = 0", "'n_slots' must be in [1, 256], not 0"),
])
def test_config_errors_are_one_line_exit_2_before_any_answer(tmp_path, toml, message):
    cfg = tmp_path / "config.toml"
    cfg.write_text(toml + "\n")
    r = efim_cli("complete", "--no-daemon", "examples/fib.py", "--line", "5", "--column", "9",
                 env={"EFIM_CONFIG": str(cfg)})
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode() == f"efim: error: {cfg}: {message}\n"


def test_missing_efim_config_file_is_an_error(tmp_path):
    r = efim_cli("cache", "stats", env={"EFIM_CONFIG": str(tmp_path / "nope.toml")})
    assert r.returncode == 2
    assert r.stderr.decode() == f"efim: error: EFIM_CONFIG={tmp_path / 'nope.toml'}: no such file\n"


@pytest.mark.parametrize("junk", ["missing", "not_a_library"])
def test_llama_cpp_lib_path_junk_is_one_line(tmp_path, junk):
    lib = tmp_path / "lib"
    if junk == "not_a_library":
        lib.mkdir()
        (lib / "libllama.so").write_text("junk")
    r = efim_cli("status", env={"LLAMA_CPP_LIB_PATH": str(lib)})
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"efim: error: LLAMA_CPP_LIB_PATH={lib}: cannot load llama.cpp")
