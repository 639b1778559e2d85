"""The smaller things a new user meets in the first hour (issue 27, items 2 and 8): a config file
that is missing while a daemon runs, -V, shell completion, rounded timings, the daemon's stop in
its log, why a daemon did not start, empty slots, and corrupt states in `cache stats`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import efim_cli

DOC = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"


@pytest.fixture
def env(tmp_path):
    (tmp_path / "rt").mkdir()
    return {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def running(env, tiny_model):
    r = efim_cli("daemon", "start", "--model", str(tiny_model), "--n-ctx", "1024", env=env)
    assert r.returncode == 0, r.stderr
    yield env
    efim_cli("daemon", "stop", env=env)


def test_a_missing_config_file_is_an_error_with_a_daemon_too(running, tmp_path):
    missing = {**running, "EFIM_CONFIG": str(tmp_path / "nope.toml")}
    for args in (["status"], ["complete", str(tmp_path / "x.py"), "-l", "1", "-c", "1"]):
        (tmp_path / "x.py").write_text(DOC)
        r = efim_cli(*args, env=missing)
        assert r.returncode == 2 and r.stderr.decode() == f"efim: error: EFIM_CONFIG={tmp_path}/nope.toml: no such file\n"


def test_the_daemon_logs_its_stop_and_empty_slots_have_no_path(running, tmp_path):
    src = tmp_path / "d.py"
    src.write_text(DOC * 12)
    assert efim_cli("complete", str(src), "-l", "3", "-c", "1", "--max-tokens", "2", env=running).returncode == 0
    assert efim_cli("cache", "clear", env=running).returncode == 0  # the daemon empties its slots
    text = efim_cli("daemon", "status", env=running).stdout.decode()
    slots = [ln for ln in text.splitlines() if ln.startswith("slot ")]
    assert slots and all(ln.endswith("-") for ln in slots if re.search(r"\s0 tokens", ln)), text
    assert str(src) not in "\n".join(ln for ln in slots if re.search(r"\s0 tokens", ln))
    assert efim_cli("daemon", "stop", env=running).returncode == 0
    log = (tmp_path / "state" / "efim" / "daemon.log").read_text()
    assert re.search(r"stopped \(pid \d+\)", log.splitlines()[-1]), log[-500:]


def test_daemon_start_says_why_it_failed(env, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    r = efim_cli("daemon", "start", "--model", str(bad), "--timeout", "60", env=env)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1, err
    assert "exited with code" in err and "broken.gguf" in err.split("(log:")[0], err  # the reason, then the log


def test_version_flag_and_shell_completion():
    for flag in ("-V", "--version"):
        r = efim_cli(flag)
        assert r.returncode == 0 and r.stdout.endswith(b", version 0.1.0\n"), r.stderr
    efim = Path(sys.executable).parent / "efim"  # the installed command: completion keys on its name
    r = subprocess.run([efim], env=dict(os.environ, _EFIM_COMPLETE="bash_source"), capture_output=True, timeout=60)
    assert r.returncode == 0 and b"complete " in r.stdout and b"_efim_completion" in r.stdout, r
    assert b"_EFIM_COMPLETE=bash_source efim" in efim_cli("--help").stdout


def test_timings_are_rounded(tiny_model, tmp_path):
    src = tmp_path / "t.py"
    src.write_text(DOC)
    out = json.loads(efim_cli("complete", str(src), "-l", "2", "-c", "5", "--model", str(tiny_model), "--json",
                              "--max-tokens", "2", "--no-cache").stdout)
    assert all(round(v, 2) == v for v in out["timings"].values()), out["timings"]


def test_cache_stats_warns_about_a_corrupt_state(tiny_model, tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    src = tmp_path / "long.py"
    src.write_text(DOC * 12)
    args = ["complete", str(src), "-l", "2", "-c", "5", "--model", str(tiny_model), "--max-tokens", "2"]
    assert efim_cli(*args, env=env).returncode == 0
    (kv,) = (tmp_path / "state" / "efim" / "kv").rglob("*.kv")
    kv.write_bytes(kv.read_bytes()[:100])  # truncated
    r = efim_cli("cache", "stats", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["corrupt"] == 1
    assert r.stderr.decode().startswith("efim: warning: 1 saved state is unreadable (state file is truncated)")
