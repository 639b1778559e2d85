"""`efim bench` end to end: the trace replayed over real daemons, and the library report of `efim status`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from efim_local.bench import peers, replay
from efim_local.eval import quality


def test_replay_through_efim_daemons(tiny_model, tmp_path):
    server = Path(os.environ.get("EFIM_LLAMA_SERVER", peers.SERVER_BIN))
    cfg = replay.ReplayConfig(tiny_model, max_requests=8, max_tokens=4, n_ctx=4096, threads=2, server=server)
    res = replay.run(cfg)
    by = {s["backend"]: s for s in res["summary"]}
    efim, fim = by["efim daemon EFIM"], by["efim daemon FIM"]
    assert efim["requests"] == fim["requests"] == 8
    # FIM recomputes the suffix on every keystroke; EFIM computes only what was typed.
    assert efim["evaluated_p50"] * 10 < fim["evaluated_p50"]
    if server.exists():
        assert by["llama-server /infill"]["requests"] == by["llama-server /completion EFIM"]["requests"] == 8
        assert by["llama-server /completion EFIM"]["evaluated_p50"] * 10 < by["llama-server /infill"]["evaluated_p50"]
    else:
        assert "make server" in res["notes"][0]


def test_status_reports_a_custom_library(tiny_model):
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(libdir))
    out = subprocess.run([sys.executable, "-m", "efim_local.cli", "status", "--json", "--model", str(tiny_model),
                          "--flash-attn", "--no-offload-kqv", "--main-gpu", "0"],
                         env=env, capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["library_source"] == f"LLAMA_CPP_LIB_PATH={libdir}"
    assert Path(info["library"]).parent == libdir and info["gpu_offload"] is False


def test_the_bench_daemon_runs_the_bench_code_whatever_the_directory(tiny_model, tmp_path, monkeypatch):
    """A checkout in the working directory never shadows the code the bench runs (``-m`` puts the
    directory first on the path: ``PYTHONPATH=other/checkout efim bench`` ran the directory's daemon);
    a PYTHONPATH and a model path relative to it still reach the daemon."""
    from efim_local.bench.util import spawn_daemon
    from efim_local.daemon.client import Client

    (tmp_path / "efim_local").mkdir()
    (tmp_path / "efim_local" / "__init__.py").write_text("raise SystemExit('the checkout here was imported')\n")
    (tmp_path / "m.gguf").symlink_to(tiny_model)
    (tmp_path / "lib").mkdir()  # imported at start-up from the path: it shows the relative entry got there
    (tmp_path / "lib" / "sitecustomize.py").write_text(f"open({str(tmp_path / 'seen')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "lib")
    proc, sock = spawn_daemon(Path("m.gguf"), None, "--n-ctx", "1024")
    try:
        with Client(sock, timeout=60) as client:
            assert client.call("complete", {"path": "/a.py", "text": "x = 1\n", "offset": 6, "max_tokens": 2})["text"] is not None
        assert (tmp_path / "seen").exists()
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_quality_part_scores_each_layout_on_humaneval(tiny_model, tmp_path):
    """`efim bench quality`: every layout answers every task (the generated programs run in a
    subprocess), the default is not run twice, and the paired intervals come per class."""
    from tests.helpers import efim_cli

    if not quality.DATA.is_dir():
        pytest.skip(f"no HumanEval-infilling data at {quality.DATA}")
    r = efim_cli("bench", "quality", "--model", str(tiny_model), "--requests", "3", "--out", str(tmp_path),
                 "--json")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    q = json.loads(r.stdout)["quality"]
    assert [row["layout"] for row in q["layouts"]] == ["fim", "fim+heal", "efim", "efim+heal", "default"]
    assert q["default_is"] == "efim+heal" and all(row["tasks"] == 3 for row in q["layouts"])
    assert {d["metric"] for d in q["paired"]} == {"exact", "pass"} and q["paired"][0]["typed last"] == "all"
    saved = json.loads(Path(q["json"]).read_text())
    assert len(saved["rows"]["fim"]) == 3 and {"exact", "pass", "class", "answer"} <= set(saved["rows"]["fim"][0])


def test_the_opening_part_restores_a_file_seen_on_an_earlier_day(tiny_model, tmp_path):
    """`efim bench opening`: the first request after an open, per condition; a file the store holds
    from an earlier daemon is restored (``seen``), a new one is not."""
    from tests.helpers import efim_cli

    r = efim_cli("bench", "opening", "--model", str(tiny_model), "--files", "1", "--tokens", "2000,200000",
                 "--waits", "0.3", "--n-ctx", "4096", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    res = json.loads(r.stdout)
    rows = json.loads(Path(res["json"]).read_text())["rows"]
    assert {(row["trace"], row["condition"]) for row in rows} == {(t, c) for t in ("efim", "click")
                                                                    for c in ("new", "seen")}
    for row in rows:
        assert 0 < row["share"] <= 1 and row["full_tokens"] > 2000 // 2
        assert row["restored"] == (row["condition"] == "seen"), row
    assert [s["condition"] for s in res["summary"]] == ["new", "seen"]
