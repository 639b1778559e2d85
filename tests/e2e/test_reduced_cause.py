"""Why the context was cut, where the user looks (issue 39): a reduced answer's ``context.reduced_by``
over the daemon's socket, its log line, and ``efim status`` (the last minute's share, the CPU other
processes take, the learned speed, what would help) -- with a core kept busy by another process."""

import contextlib
import json
import subprocess
import sys
import time

from tests.helpers import Daemon, efim_cli

BIG = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))


@contextlib.contextmanager
def busy_core():
    """One core kept busy by another process (`python -c 'while True: pass'`)."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield p
    finally:
        p.kill()
        p.wait()


def test_a_reduced_answer_says_why_in_the_reply_the_log_and_the_status(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model, budget_ms=1).start()
    try:
        with busy_core(), d.client() as c:
            cursor = BIG.index("def f250")
            out = c.call("complete", {"path": "/src/big.py", "text": BIG, "offset": cursor, "max_tokens": 2})
            ctx = out["context"]
            assert ctx["reduced"] and ctx["share"] < 1, ctx
            why = ctx["reduced_by"]
            assert why["cause"] == "latency_budget" and why["budget_ms"] == 1, why
            assert why["missing_tokens"] == ctx["full_tokens"] - ctx["tokens"] and why["missing_ms"] > 1, why
            assert why["prefill_tok_s"] > 0 and why["cores"] >= 1, why
            assert why["text"].startswith(f"latency budget 1 ms; the other {why['missing_tokens']} tokens need "), why
            st = c.call("status")
            # the other process's core (and whatever else runs here): the status counts it, now
            assert st["cores_used_by_others"] >= 0.75 and st["cores_free"] < st["cores"] or st["cores"] == 1, st
            assert st["max_prompt_ms"] == 1 and st["prefill_tok_s"] > 0 and st["budget_tokens"] is not None, st
            minute = st["requests"]["context"]["last_minute"]
            assert minute == {"requests": 1, "reduced": 1, "mean_share": ctx["share"]}, minute
            help_ = st["context_help"]
            assert "fewer other processes (other processes use " in help_ and "a larger max_prompt_ms (now 1 ms" in help_
            env = {"EFIM_SOCKET": str(d.sock), **{k: d.env[k] for k in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "EFIM_CONFIG")}}
            text = efim_cli("daemon", "status", env=env).stdout.decode()
            assert "; last minute: 1 answers, " in text and ", 1 reduced" in text, text
            assert "speed        prefill " in text and "max_prompt_ms 1 " in text and "other processes use " in text, text
            assert "would help   fewer other processes" in text, text
    finally:
        d.stop()
    log = d.proc.stderr.read().decode()
    line = next(ln for ln in log.splitlines() if " complete /src/big.py " in ln)
    assert f"; reduced by {why['text']}" in line, line


def test_status_in_process_counts_the_cpu_other_processes_take(tmp_path, tiny_model):
    """Before: a one-shot `efim status` never measured: `cores_free 2`, `cores_used_by_others 0.0` at a load of 3."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "rt").mkdir()
    with busy_core():
        r = efim_cli("status", "--json", "--model", str(tiny_model), env=env)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["via"] == "in-process" and st["threads_auto"], st
    assert st["cores_used_by_others"] >= 0.75, st
    assert st["cores"] == 1 or (st["cores_free"] < st["cores"] and st["threads"] == st["cores_free"]), st
    assert "fewer other processes (other processes use " in st["context_help"], st
