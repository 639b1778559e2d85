"""`efim bench` pieces: edit traces, the FIM-token GGUF copy, the replay over real daemons, and the
native backend's runtime options and library report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from efim_local.llama import Batch, Context, ContextParams, Model
from efim_local.bench import peers, replay, trace
from efim_local.cli import build_config
from efim_local.bench.fim_copy import with_fim_tokens


def test_trace_requests_type_a_commit_at_word_ends():
    before = "def f(x):\n    return x\n\n\nprint(f(1))\n"
    after = "def f(x, y):\n    total = x + y\n    return total\n\n\nprint(f(1, 2))\n"
    reqs = list(trace.requests(trace.Commit("a.py", "0", "s", before, after)))
    assert reqs, "no request was made"
    words = 0
    for r in reqs:
        assert r.text[r.offset - 1].isalnum() or r.text[r.offset - 1] == "_"
        assert r.offset == len(r.text) or not (r.text[r.offset].isalnum() or r.text[r.offset] == "_")
        words += 1
    # Every word typed in the changed lines gives one request, and the last state is the new file.
    assert "total = x + y" in reqs[-1].text and reqs[-1].text.startswith("def f(x, y)")
    assert words == len(reqs) >= 8


def test_shipped_trace_is_real_commits():
    commits = trace.load()
    assert len(commits) >= 3 and all(len(c.sha) == 12 and c.before != c.after for c in commits)
    assert sum(1 for c in commits[:2] for _ in trace.requests(c)) >= 50


def test_fim_token_copy_keeps_the_weights(tiny_model_nofim, tmp_path):
    dst = with_fim_tokens(tiny_model_nofim, tmp_path / "fim.gguf", ids=[5, 6, 7])
    with Model(tiny_model_nofim) as a, Model(dst) as b:
        assert not a.fim_ids() and b.fim_ids() == {"pre": 5, "suf": 6, "mid": 7}
        ids = a.tokenize("def add(a, b):\n    return a + b\n")
        assert ids == b.tokenize("def add(a, b):\n    return a + b\n")
        logits = []
        for m in (a, b):
            with Context(m, ContextParams(n_ctx_seq=128, n_slots=1)) as ctx, Batch(128) as batch:
                for i, t in enumerate(ids):
                    batch.add(t, i, 0, logits=i == len(ids) - 1)
                ctx.decode(batch)
                logits.append(np.array(ctx.logits(len(ids) - 1)))
        assert np.array_equal(*logits)


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


def test_runtime_options_pass_through():
    cfg = build_config(None, None, None, None, None, None, n_gpu_layers=3, main_gpu=1, offload_kqv=False,
                       flash_attn=True)
    assert (cfg.n_gpu_layers, cfg.main_gpu, cfg.context.offload_kqv, cfg.context.flash_attn) == (3, 1, False, True)
    cfg = build_config(None, None, None, None, None, None, None, None, None, None)
    assert cfg.context.offload_kqv is True and cfg.context.flash_attn is False


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
