"""Daemon settings travel as configuration; the cursor notification prefills."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..helpers import Daemon, efim_cli

LONG = "".join(f"def f{i}(x):\n    return x * {i} + len(str(x))\n\n\n" for i in range(120))


def test_background_daemon_gets_flash_attention_threads_and_watched_roots(tmp_path, tiny_model):
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "rt").mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        r = efim_cli("daemon", "start", "--model", str(tiny_model), "--flash-attn", "--no-offload-kqv",
                     "--threads", "1", "--watch", str(ws), env=env)
        assert r.returncode == 0, r.stderr
        st = json.loads(efim_cli("daemon", "status", "--json", env=env).stdout)
        assert st["flash_attn"] is True and st["offload_kqv"] is False and st["threads"] == 1
        assert st["watching"] == [str(ws.resolve())]
        r = efim_cli("daemon", "restart", "--model", str(tiny_model), env=env)
        assert r.returncode == 0, r.stderr
        st = json.loads(efim_cli("daemon", "status", "--json", env=env).stdout)
        assert st["watching"] == [str(ws.resolve())] and st["flash_attn"] is False  # roots kept, options not
    finally:
        efim_cli("daemon", "stop", env=env)


def test_daemon_start_from_a_folder_with_a_shadowing_module(tmp_path, tiny_model):
    """The background daemon does not import the caller's logging.py."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "rt").mkdir()
    (tmp_path / "logging.py").write_text("raise SystemExit('shadowed')\n")
    try:
        # The console script, as a user runs it (``python -m`` would put the folder on sys.path itself).
        efim = Path(sys.executable).with_name("efim")
        r = subprocess.run([str(efim), "daemon", "start", "--model", str(tiny_model)], capture_output=True,
                           env=dict(os.environ, **env), cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        efim_cli("daemon", "stop", env=env)


def _slot_tokens(c, path: str) -> int:
    return max((s["tokens"] for s in c.call("status")["slots"] if s["path"] == path), default=0)


def _wait_until(cond, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_cursor_notification_prefills_the_plan_anchored_there(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model).start()
    try:
        with d.client() as c:
            c.call("didOpen", {"path": "cur.py", "text": LONG, "version": 1})
            _wait_until(lambda: _slot_tokens(c, "cur.py") > 500)  # didOpen prefills the file
            line = 300
            c.notify("cursor", {"path": "cur.py", "position": {"line": line, "character": 4}})
            _wait_until(lambda: c.call("status")["idle_tasks"] == 0)  # the daemon prefilled there
            out = c.call("complete", {"path": "cur.py", "position": {"line": line, "character": 4},
                                      "max_tokens": 2})
            assert out["reanchor"] is None and out["cache_tier"] == "slot", out
            assert out["tokens"]["evaluated"] <= 2, out["tokens"]
    finally:
        d.stop()


def test_with_a_budget_the_cursor_prefill_plans_as_the_request_will_then_grows(tmp_path, tiny_model):
    """Under a latency budget the prefill takes the anchor the next request will plan (reduced, its
    new tokens within the budget), then grows it to the full plan while idle: the request that
    follows finds the full plan cached and computes a token or two."""
    d = Daemon(tmp_path, tiny_model, budget_ms=1).start()
    try:
        with d.client() as c:
            _wait_until(lambda: c.call("status")["idle_tasks"] == 0)  # the speed is measured
            c.call("didOpen", {"path": "cur.py", "text": LONG, "version": 1})
            line = 300
            c.notify("cursor", {"path": "cur.py", "position": {"line": line, "character": 4}})
            _wait_until(lambda: c.call("status")["idle_tasks"] == 0)
            out = c.call("complete", {"path": "cur.py", "position": {"line": line, "character": 4},
                                      "max_tokens": 2})
            assert out["reanchor"] is None and not out["context"]["reduced"], out
            assert out["tokens"]["evaluated"] <= 2, out["tokens"]
    finally:
        d.stop()
