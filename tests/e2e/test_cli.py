"""`efim complete` end to end, in a subprocess, on the tiny GGUF."""

import json
import os
import re

import pytest

from tests.helpers import ROOT, Daemon, efim_cli

DOC = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "add.py"
    p.write_text(DOC)
    return p


def test_complete_json(src, tiny_model):
    r = efim_cli("complete", str(src), "--line", "2", "--column", "12", "--model", str(tiny_model),
                 "--json", "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "stop_reason", "layout", "tokens", "timings"}
    assert set(out["tokens"]) == {"prompt", "cached", "evaluated", "generated"}
    assert set(out["timings"]) == {"prompt_ms", "predict_ms", "total_ms", "plan_ms"}
    assert out["tokens"]["generated"] <= 5 and out["layout"] == "efim"
    assert r.stderr == b""


def test_verbose_says_the_path_and_the_context(src, tiny_model):
    args = ["complete", str(src), "-l", "2", "-c", "12", "--model", str(tiny_model), "--max-tokens", "2"]
    ctx = json.loads(efim_cli(*args, "--json").stdout)["context"]
    r = efim_cli(*args, "-v")
    assert r.returncode == 0 and r.stderr.decode().splitlines() == [
        "efim: answering in-process (--model given)",
        f"efim: context {ctx['tokens']} of {ctx['full_tokens']} tokens (100%)"]  # a small file: nothing cut


def test_one_shot_uses_the_whole_plan_unless_a_budget_is_given(tmp_path, tiny_model):
    """One answer is awaited: no latency budget cuts its context unless one is asked for, in-process or
    by a daemon whose budget (for editors) would."""
    big = tmp_path / "big.py"
    big.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400)))
    args = ["complete", str(big), "-l", "601", "-c", "5", "--model", str(tiny_model), "--max-tokens", "2", "--no-cache",
            "--json"]  # (no saved state: it would make the whole plan cached, in budget)
    conf = tmp_path / "config.toml"  # the daemon's budget, a tight one: not the one-shot's
    conf.write_text("max_prompt_ms = 1\n")
    whole = json.loads(efim_cli(*args, env={"EFIM_CONFIG": str(conf)}).stdout)["context"]
    assert whole["full_tokens"] > 3000 and whole["share"] == 1.0 and not whole["reduced"]
    r = efim_cli(*args[:-1], "--max-prompt-ms", "1", "-v")
    assert r.returncode == 0 and "reduced by the latency budget" in r.stderr.decode()
    d = Daemon(tmp_path / "d", tiny_model, budget_ms=1).start()
    try:
        env = {"EFIM_SOCKET": str(d.sock)}
        via = ["complete", str(big), "-l", "601", "-c", "5", "--max-tokens", "2", "--json"]
        out = json.loads(efim_cli(*via, env=env).stdout)
        assert out["via"] == "daemon" and out["context"]["share"] == 1.0 and not out["context"]["reduced"]
        via[3] = "301"  # (another window: not the slot's plan)
        out = json.loads(efim_cli(*via, "--max-prompt-ms", "1", env=env).stdout)
        assert out["via"] == "daemon" and out["context"]["reduced"], out["context"]
    finally:
        d.stop()


def test_an_empty_answer_says_so(src, tiny_model):
    args = ["complete", str(src), "-l", "2", "-c", "12", "--model", str(tiny_model), "--max-tokens", "0"]
    r = efim_cli(*args)
    assert r.returncode == 0 and r.stdout == b"\n"
    assert r.stderr.decode() == "efim: empty answer: max_tokens allows no token\n"
    out = json.loads(efim_cli(*args, "--json").stdout)
    assert out["text"] == "" and out["empty"] == "max_tokens allows no token"


def test_complete_stdin_matches_file(src, tiny_model):
    args = ["--line", "2", "--column", "5", "--model", str(tiny_model), "--json", "--max-tokens", "6"]
    a = json.loads(efim_cli("complete", str(src), *args).stdout)
    b = json.loads(efim_cli("complete", "named.py", "--stdin", *args, input=DOC.encode()).stdout)
    assert a["text"] == b["text"]


def test_stdin_names_the_same_file_as_its_path(src, tiny_model, tmp_path):
    """`--stdin` with a relative name is the file that name resolves to: the daemon keys both the same
    (it kept the name as given, so the same name from two directories shared one entry)."""
    d = Daemon(tmp_path / "d", tiny_model).start()
    try:
        env = {"EFIM_SOCKET": str(d.sock)}
        args = ["--line", "2", "--column", "5", "--json", "--max-tokens", "4"]
        efim_cli("complete", str(src), *args, env=env)
        piped = json.loads(efim_cli("complete", os.path.relpath(src, ROOT), "--stdin", *args, env=env,
                                    input=DOC.encode()).stdout)
        with d.client() as c:
            files = c.call("status", {})["requests"]["files"]
        assert list(files) == [str(src.resolve())] and files[str(src.resolve())]["requests"] == 2, (files, piped)
    finally:
        d.stop()


def test_model_from_env(src, tiny_model):
    r = efim_cli("complete", str(src), "-l", "1", "-c", "1", "--max-tokens", "2", env={"EFIM_MODEL": str(tiny_model)})
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,message", [
    (["missing.py", "-l", "1", "-c", "1"], "file not found"),
    (["{src}", "-l", "99", "-c", "1"], "past the end of the document"),
    (["{src}", "-l", "1", "-c", "200"], "past the end of line 1"),
    (["{bin}", "-l", "1", "-c", "1"], "not valid UTF-8"),
    (["{src}", "-l", "1", "-c", "1", "--model", "{src}"], "not a GGUF model file"),
    (["{src}", "-l", "1", "-c", "1", "--model", "nope.gguf"], "model file not found"),
    (["{src}", "-l", "1", "-c", "1", "--model", "{nofim}"], "model has no FIM tokens"),
    (["{src}", "-l", "1", "-c", "1", "--fim-family", "nosuch"], "unknown FIM family"),
    (["{src}", "-l", "1", "-c", "1", "--fim-family", "deepseek"], "no deepseek FIM tokens"),
    (["{src}", "-l", "1", "-c", "1", "--fim-template", "onlyone"], "a text template is"),
    (["{src}", "-l", "1", "-c", "1", "--max-tokens", "4090"], "ask for fewer (max_tokens)"),
    (["{src}", "-l", "1", "-c", "1", "--model", "{trunc}"], "could not load"),
])
def test_bad_input_is_one_line_and_exit_2(src, tmp_path, tiny_model, tiny_model_nofim, args, message):
    binf = tmp_path / "bin.py"
    binf.write_bytes(b"x = '\xff\xfe'\n")
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF\x03\x00\x00\x00\x10\x00")  # a GGUF cut short: llama.cpp itself refuses it
    fill = {"src": str(src), "bin": str(binf), "nofim": str(tiny_model_nofim), "trunc": str(trunc)}
    args = [a.format(**fill) for a in args]
    if "--model" not in args:
        args += ["--model", str(tiny_model)]
    r = efim_cli("complete", *args)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("efim: error:") and message in err, err


@pytest.mark.parametrize("args,message", [
    (["complete"], "Missing argument 'PATH'"),
    (["complete", "x.py", "-l", "1", "-c", "0"], "'--column'"),
    (["complete", "--bogus"], "No such option '--bogus'"),
    (["serve", "--watch", "/nonexistent-efim-dir"], "'/nonexistent-efim-dir' does not exist"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_are_one_line_and_exit_2(args, message):
    """click's own usage errors too: one line that says where the help is, not its usage block."""
    r = efim_cli(*args)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and err.startswith("efim: error:") and message in err, err
    assert "--help" in err and not r.stdout


def test_text_template_for_model_without_fim_tokens(src, tiny_model_nofim):
    r = efim_cli("complete", str(src), "-l", "2", "-c", "5", "--model", str(tiny_model_nofim),
                 "--fim-template", "<PRE>,<SUF>,<MID>", "--json", "--max-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"]["prompt"] > 10


def test_help_has_examples():
    r = efim_cli("complete", "--help")
    assert r.returncode == 0 and b"Example" in r.stdout


def test_cache_commands(tiny_model, tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    src = tmp_path / "long.py"
    src.write_text(DOC * 12)  # long enough to be worth saving
    args = ["complete", str(src), "-l", "2", "-c", "5", "--model", str(tiny_model), "--json", "--max-tokens", "3"]
    first = json.loads(efim_cli(*args, env=env).stdout)
    second = json.loads(efim_cli(*args, env=env).stdout)
    assert first["cache_tier"] == "none" and second["cache_tier"] == "disk"
    assert second["tokens"]["evaluated"] == 1 and second["text"] == first["text"]
    rows = json.loads(efim_cli("cache", "ls", "--json", env=env).stdout)
    assert len(rows) == 1 and rows[0]["path"] == str(src.resolve()) and rows[0]["tier"] == "disk"
    stats = json.loads(efim_cli("cache", "stats", "--json", env=env).stdout)
    assert stats["hits"]["disk"] == 1 and stats["misses"]["no_state"] == 1
    assert json.loads(efim_cli("cache", "gc", "--json", env=env).stdout)["files_without_row"] == 0
    ls = efim_cli("cache", "ls", env=env).stdout.decode().splitlines()
    assert ls[0].split() == ["id", "tier", "tokens", "MiB", "hits", "path"] and ls[1].endswith(str(src.resolve()))
    assert json.loads(efim_cli("cache", "clear", "--json", env=env).stdout) == {"deleted": 1, "daemon": False}
    assert json.loads(efim_cli("cache", "ls", "--json", env=env).stdout) == []
    empty = efim_cli("cache", "ls", env=env).stdout.decode()  # not silence: say where it looked
    assert empty == f"no saved states in {tmp_path / 'state' / 'efim' / 'kv'}\n"
    text = efim_cli("cache", "stats", env=env).stdout.decode()
    assert "0.00 / 512 MiB" in text and "0.00 / 4096 MiB" in text  # the configured budgets, in MiB
    status = json.loads(efim_cli("status", "--json", "--model", str(tiny_model), env=env).stdout)
    assert status["swa_strategy"] == "none" and status["state_restore"] == "longest prefix"


def test_status_reports_sliding_window_strategy(tiny_model_swa):
    status = json.loads(efim_cli("status", "--json", "--model", str(tiny_model_swa)).stdout)
    assert status["sliding_window"] == 32 and status["swa_strategy"] == "swa_full"
    assert status["state_restore"] == "whole-state checkpoints"


def test_bundled_default_model_is_fragment_trained(src):
    """Without --model, `efim complete` uses the bundled model, which picks EFIM by itself."""
    r = efim_cli("complete", str(src), "-l", "2", "-c", "9", "--json", "--max-tokens", "4", "--no-daemon")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layout"] == "efim"
    status = json.loads(efim_cli("status", "--json").stdout)
    assert status["fragment_trained"] is True and status["model"].endswith("efim-default.gguf")


def test_daemon_commands(tmp_path, tiny_model):
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "rt").mkdir()
    try:
        r = efim_cli("daemon", "start", "--model", str(tiny_model), env=env)
        assert r.returncode == 0 and b"started" in r.stdout, r.stderr
        again = efim_cli("daemon", "start", "--model", str(tiny_model), env=env)
        assert again.returncode == 1 and b"already running" in again.stderr
        st = json.loads(efim_cli("daemon", "status", "--json", env=env).stdout)
        assert st["running"] and st["model"] == str(tiny_model) and st["socket"].startswith(str(tmp_path / "rt"))
        src = tmp_path / "d.py"
        src.write_text(DOC * 12)
        args = ["complete", str(src), "-l", "3", "-c", "1", "--json", "--max-tokens", "3"]
        first, second = (json.loads(efim_cli(*args, env=env).stdout) for _ in range(2))
        # the daemon's answer cache, or (the latency budget reduced the first plan, and idle growth
        # computed the full one) the slot the daemon kept
        assert second["source"] == "cache" or (second["cache_tier"] == "slot" and second["tokens"]["evaluated"] <= 1)
        third = json.loads(efim_cli(*args[:-1], "4", env=env).stdout)
        # the daemon kept the slot (and the first token's logits, unless growth ran another plan there)
        assert third["cache_tier"] == "slot" and third["tokens"]["evaluated"] <= 1
        st = json.loads(efim_cli("daemon", "status", "--json", env=env).stdout)
        assert st["served"] == 3 and st["requests"]["sources"]["answers"] == 3
        said = efim_cli(*args[:-2], "-v", env=env).stderr.decode()  # -v: which path, and the context it used
        assert "answered by the daemon" in said
        assert re.search(r"^efim: context \d+ of \d+ tokens \(\d+%\)", said, re.M), said
        plain = efim_cli("status", env=env).stdout.decode()  # in words, not Python's reprs
        assert re.search(r"^context +mean \d+ tokens \(median \d+\), \d+% of the full plans", plain, re.M), plain
        assert re.search(r"^answers +4 answers: ", plain, re.M) and "{" not in plain, plain
    finally:
        efim_cli("daemon", "stop", env=env)
    r = efim_cli("daemon", "status", env=env)
    assert r.returncode == 1 and b"not running" in r.stdout
