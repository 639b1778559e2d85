"""An observable daemon: a log line per request, `daemon logs`, a status that shows threads, KV
type, slots, tier usage, latency percentiles and hit rates, `efim status` and `efim complete`
saying which path answered, and `efim cache clear` reaching the running daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from tests.helpers import efim_cli, wait_until

DOC = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n" * 12
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


@pytest.fixture
def env(tmp_path, tiny_model):
    (tmp_path / "rt").mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'model = "{tiny_model}"\nmax_prompt_ms = 0\n[context]\nn_ctx_seq = 1024\nn_slots = 3\n')
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "EFIM_CONFIG": str(cfg)}
    r = efim_cli("daemon", "start", env=env)
    assert r.returncode == 0, r.stderr
    yield env
    efim_cli("daemon", "stop", env=env)


def cli(env, *args, code=0):
    r = efim_cli(*args, env=env)
    assert r.returncode == code, (r.stdout + r.stderr).decode()
    return r


def test_requests_are_logged_and_status_shows_them(env, tmp_path):
    src = tmp_path / "a.py"
    src.write_text(DOC)
    args = ["complete", str(src), "-l", "3", "-c", "1", "--json", "--max-tokens", "3"]
    follow = subprocess.Popen([sys.executable, "-m", "efim_local.cli", "daemon", "logs", "-f", "-n", "1"],
                              env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    # its first line (the daemon's last one, "serving on") proves it is following before any request
    assert "serving on" in follow.stdout.readline()
    first = cli(env, *args, "-v")
    assert json.loads(first.stdout)["via"] == "daemon"
    ctx = json.loads(first.stdout)["context"]
    assert first.stderr.decode() == (f"efim: answered by the daemon on {tmp_path / 'rt' / 'efim' / 'efim.sock'}\n"
                                     f"efim: context {ctx['tokens']} of {ctx['full_tokens']} tokens (100%)\n")
    # (another max_tokens: the same request again would be answered by the daemon's answer cache)
    second = json.loads(cli(env, *args[:-1], "4").stdout)
    assert second["via"] == "daemon" and second["cache_tier"] == "slot" and second["source"] == "computed"

    st = json.loads(cli(env, "daemon", "status", "--json").stdout)
    layout, why = st["layout"], st["layout_reason"]
    logs = cli(env, "daemon", "logs").stdout.decode()
    followed = []  # `logs -f` printed the new lines as they came
    reader = threading.Thread(target=lambda: followed.extend(follow.stdout.readline() for _ in range(3)), daemon=True)
    reader.start()
    reader.join(20)
    follow.terminate()
    follow.wait(10)
    assert len(followed) == 3, followed
    assert "first request" in followed[0] and " complete " in followed[1] and " complete " in followed[2]
    lines = [ln for ln in logs.splitlines() if " complete " in ln]
    assert len(lines) == 2 and all(re.match(STAMP + " INFO efim.daemon: complete ", ln) for ln in lines)
    assert re.search(f"complete {re.escape(str(src))} layout={layout} context=\\d+/\\d+\\(100%\\) cached=0 evaluated=",
                     lines[0]), lines[0]  # the context used, of the full plan's, and not reduced
    assert "tier=none reanchor=new_session" in lines[0]
    # (the same prompt again: its slot holds all of it, and the logits after it: Decoder.kept_logits)
    assert "cached=" in lines[1] and "evaluated=0 generated=4 tier=slot reanchor=- source=computed " in lines[1]
    assert f"first request: layout {layout} ({why})" in logs
    assert "DEBUG" not in logs and "watchdog" not in logs  # no library chatter without -v
    assert cli(env, "daemon", "logs", "-n", "1").stdout.decode().count("\n") == 1

    st = json.loads(cli(env, "daemon", "status", "--json").stdout)
    req = st["requests"]
    assert req["window"] == 2 and 0 < req["p50_ms"] <= req["p95_ms"]
    assert req["files"][str(src)] == {"requests": 2, "hit_rate": 0.5, "cached_tokens": second["tokens"]["cached"],
                                      "prompt_tokens": 2 * second["tokens"]["prompt"]}
    full = second["context"]["full_tokens"]
    assert req["context"] == {"mean_tokens": float(full), "median_tokens": full, "mean_share": 1.0, "reduced": 0.0,
                              "last_minute": {"requests": 2, "reduced": 0, "mean_share": 1.0}}
    assert st["context_help"] == "nothing: the latency budget is off (max_prompt_ms = 0)"  # (the test daemon's)
    text = cli(env, "daemon", "status").stdout.decode()
    assert (f"context used mean {full} tokens (median {full}), 100% of the full plans, 0% reduced by the latency "
            "budget; last minute: 2 answers, 100% of the full plans, 0 reduced") in text
    assert "would help   nothing: the latency budget is off (max_prompt_ms = 0)" in text
    heal = f"healing      {'on' if st['heal'] else 'off'}: {st['heal_reason']}"  # (issue 16 decides the defaults)
    for want in ("KV f16/f16", f"layout       {layout}: {why}", heal, "latency p50", "p95",
                 f" 50% hits     2 requests  {src}", "ram tier", "disk tier", "/ 512 MiB", "threads",
                 "engine time  ", " generate "):
        assert want in text, (want, text)
    # what runs in each slot as status asked: its job and phase, or idle
    assert re.search(rf"slot \d +\d+ tokens  (idle|[a-z]+ \((prefill|generate)\)) +{re.escape(str(src))}", text)

    # `efim status` is the daemon's, without loading the model in this process
    daemon_heal = st["heal"]
    st = json.loads(cli(env, "status", "--json").stdout)
    assert st["via"] == "daemon" and st["daemon_pid"] > 0 and st["context"]["mean_share"] == 1.0
    assert st["store"] == json.loads(cli(env, "daemon", "status", "--json").stdout)["store"]["dir"]
    assert st["engine_time_s"]["generate"] > 0  # where the engine's time went
    assert (st["layout"], st["layout_reason"], st["heal"]) == (layout, why, daemon_heal)

    # options that need another engine never bypass the daemon silently
    r = cli(env, *args, "--threads", "1")
    assert json.loads(r.stdout)["via"] == "in-process"
    assert r.stderr.decode() == "efim: a daemon is running, but --threads needs its own engine: answering in-process\n"
    r = cli(env, *args, "--no-daemon", "-v")
    assert r.stderr.decode().splitlines()[0] == "efim: answering in-process (--no-daemon given)"


def test_cache_clear_reaches_the_running_daemon(env, tmp_path):
    """Before: the daemon kept its slots and RAM tier and wrote the states back after the clear."""
    src = tmp_path / "b.py"
    src.write_text(DOC)
    args = ["complete", str(src), "-l", "3", "-c", "1", "--json", "--max-tokens", "3"]
    cli(env, *args)
    ls = lambda: json.loads(cli(env, "cache", "ls", "--json").stdout)
    assert len(wait_until(ls, what="the daemon to save its dirty slot (after a quiet moment)")) == 1
    out = json.loads(cli(env, "cache", "clear", "--json").stdout)
    assert out["daemon"] is True and out["deleted"] == 1
    st = json.loads(cli(env, "daemon", "status", "--json").stdout)
    assert all(s["tokens"] == 0 for s in st["slots"]) and st["store"]["tiers"]["ram"]["states"] == 0
    cli(env, "daemon", "stop")  # a daemon saves its dirty slots when it stops: none may be left
    assert ls() == []
    cli(env, "daemon", "start")
    again = json.loads(cli(env, *args).stdout)
    assert again["via"] == "daemon" and again["tokens"]["cached"] == 0 and again["cache_tier"] == "none"


def test_cache_tier_agrees_with_cached_tokens(tmp_path, tiny_model):
    """Every answer, streamed or not, says where its cached tokens came from: ``cached > 0`` exactly
    when ``cache_tier`` is not "none" (a streamed answer once said 13 cached from tier "none": a
    reuse shorter than the slot manager's threshold). Short reuses must occur for this to test it."""
    from tests.helpers import Daemon

    d = Daemon(tmp_path, tiny_model, "--n-ctx", "512").start()
    seen = []
    try:
        with d.client() as c:
            docs = ["x = 1\n", "def f(a):\n    return a\n", "import os\nprint(os.getcwd())\n", "y = 2\nz = 3\n"]
            for i, text in enumerate(docs * 3):
                for stream in (True, False):
                    # (max_tokens differs from one document to the next: the answer cache does not answer them)
                    out = c.call("complete", {"path": f"/w/f{i % 5}.py", "text": text, "offset": len(text),
                                              "max_tokens": 2 + i, "stream": stream}, on_notification=lambda m: None)
                    seen.append((out["tokens"]["cached"], out["cache_tier"]))
    finally:
        d.stop()
    assert [(n, t) for n, t in seen if (n > 0) != (t != "none")] == []
    assert any(0 < n < 16 for n, _ in seen) and any(n == 0 for n, _ in seen)
