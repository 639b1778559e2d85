"""The `efim bench` subcommands that were scripts (efim_local/cli/bench_more.py), each run once as a
user runs it (`efim bench NAME ... --json`), on the tiny model and a few requests: seconds each."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import efim_cli


def bench(*args, ok=(0,)) -> dict:
    r = efim_cli("bench", *args, "--json")
    assert r.returncode in ok, r.stderr.decode()[-2000:]
    return json.loads(r.stdout)


def test_the_daemon_latency_benches(tiny_model, tmp_path):
    """`efim bench overhead`, `lsp` and `cli`: a fully cached completion through a real daemon, timed
    at the client, through `efim lsp`, and as fresh `efim` processes."""
    res = bench("overhead", "--model", str(tiny_model), "--requests", "3", "--out", str(tmp_path))
    assert res["result"]["p50_rtt_ms"] >= res["result"]["p50_engine_ms"] > 0
    assert Path(res["json"]) == tmp_path / "overhead-model.json" and Path(res["json"]).exists()

    res = bench("lsp", "--model", str(tiny_model), "--requests", "3", "--out", str(tmp_path))
    assert res["result"]["requests"] == 3 and res["result"]["p50_lsp_ms"] > 0 and "rows" not in res
    assert len(json.loads(Path(res["json"]).read_text())["rows"]) == 3

    res = bench("cli", "--model", str(tiny_model), "--runs", "1", "--out", str(tmp_path))
    assert [row["command"] for row in res["rows"]] == ["efim --version", "efim models list", "efim daemon status",
                                                       "efim complete (cached, daemon)"]
    assert res["engine_p50_ms"] >= 0


def test_the_load_bench_checks_errors_answers_and_memory(tiny_model, tmp_path):
    res = bench("load", "--model", str(tiny_model), "--clients", "2", "--requests", "3", "--replay-every", "1",
                "--out", str(tmp_path))
    row = res["result"]
    assert (row["requests"], row["errors"], row["replayed"], row["mismatches"]) == (6, 0, 6, 0)
    assert res["failed"] == [] and row["rss_peak_mb"] <= row["rss_limit_mb"]


def test_the_instant_bench_types_through_and_accepts(tiny_model, tmp_path):
    out = tmp_path / "instant.json"
    r = efim_cli("bench", "instant", "--model", str(tiny_model), "--cursors", "2", "--keys", "2", "--key-ms", "0",
                 "--read-ms", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    res = json.loads(r.stdout)
    assert res == json.loads(out.read_text()) and res["cursors"] == 2
    assert res["type_through"]["keystrokes"] <= 4 and 0 <= res["type_through"]["share"] <= 1


def test_the_engine_benches(tiny_model, tmp_path):
    """`efim bench drafts`, `speed` and `subtoken` in-process on the tiny model."""
    res = bench("drafts", "--model", str(tiny_model), "--cursors", "2", "--max-tokens", "8", "--out", str(tmp_path),
                ok=(0, 1))  # (1: an answer with drafts differed, which the JSON says)
    assert res["cursors"] == 2 and res["table"][0]["completions"] == "overall" and "rows" not in res

    models = tmp_path / "models"
    models.mkdir()
    (models / "qwen2.5-coder-0.5b-random-q8_0.gguf").symlink_to(tiny_model)
    res = bench("speed", "--models", str(models), "--threads", "1", "--chars", "600", "--tokens", "4")
    assert [(row["model"], row["threads"]) for row in res["rows"]] == [("0.5b", 1)]
    assert res["rows"][0]["warm_evaluated"] < res["rows"][0]["cold_evaluated"]
    assert res["skipped"] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-3b"]

    res = bench("subtoken", "--model", str(tiny_model), "--name", "tiny", "--cursors", "4", "--out", str(tmp_path))
    assert {(row["condition"], row["class"]) for row in res["summary"]} == {
        (c + s, k) for c in ("FIM", "EFIM") for s in ("", "+heal", " oracle") for k in ("mid-word", "boundary")}
    assert (tmp_path / "subtoken-tiny.json").exists() and "per_cursor" not in res


def test_the_infinigen_bench_compares_partial_restores(tiny_model, tmp_path):
    from efim_local.kv.sparse.select import POLICIES

    res = bench("infinigen", "--model", str(tiny_model), "--tokens", "300", "--samples", "1", "--tail", "8",
                "--line-tokens", "8", "--budgets", "0.2", "--out", str(tmp_path))
    assert [row["policy"] for row in res["rows"]] == list(POLICIES)
    assert all(row["budget"] == "20%" and 0 < row["bytes_%"] < 100 for row in res["rows"])


@pytest.mark.skipif(not shutil.which("nvim"), reason="nvim not installed")
def test_the_nvim_bench_reads_the_first_ghost(tiny_model, tmp_path):
    pytest.importorskip("pynvim")
    res = bench("nvim", "--model", str(tiny_model), "--files", "1", "--min-chars", "20000", "--max-tokens", "4",
                "--out", str(tmp_path))
    assert [s["mode"] for s in res["summary"]] == ["typed at once", "after a pause"]
    assert all(row["evaluated"] >= 0 and row["tier"] != "?" for row in res["rows"])  # the info line was read


def test_the_team_bench_against_llama_server(tiny_model, tmp_path):
    from efim_local.bench import peers

    server = Path(os.environ.get("EFIM_LLAMA_SERVER", peers.SERVER_BIN))
    if not server.exists():
        pytest.skip(f"no llama-server at {server} (make server)")
    res = bench("team", "--model", str(tiny_model), "--users", "2", "--rounds", "2", "--max-tokens", "4",
                "--threads", "1", "--server", str(server), "--out", str(tmp_path))
    assert [(s["layout"], s["requests"]) for s in res["summary"]] == [("fim", 4), ("efim", 4)] and "raw" not in res
