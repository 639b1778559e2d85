"""The paced replay and the context part end to end, over a real daemon (and llama-server when built)."""

import os
from pathlib import Path

from efim_local.bench import context, paced, peers
from efim_local.engine.completion import SOURCES


def test_paced_replay_times_the_first_text_at_the_client(tiny_model):
    server = Path(os.environ.get("EFIM_LLAMA_SERVER", peers.SERVER_BIN))
    cfg = paced.PacedConfig(tiny_model, max_requests=12, max_tokens=8, n_ctx=4096, threads=1, server=server,
                            trace="click")
    res = paced.run(cfg)
    assert res["trace"] == "click" and res["requests"] == 12
    for name, rows in res["rows"].items():
        shown = [r for r in rows if r["ttft_ms"] is not None]
        assert shown, name
        assert all(r["stale"] for r in rows if r["ttft_ms"] is None)  # no text, no ghost
        if name == "efim":
            # A cancelled request's estimate is its send time plus its prompt_ms: its first text at the
            # client comes after that. (A finished one's, its end less predict_ms, also counts what the
            # daemon does after the last token, such as keeping the answer for type-through.)
            assert all(r["ttft_ms"] >= r["ttft_derived_ms"] - 2 for r in shown
                       if r["ttft_derived_ms"] is not None and r["cancelled"])
            assert all(r["source"] in SOURCES for r in shown
                       if not r["cancelled"])
    s = {x["backend"]: x for x in res["summary"]}
    assert "derived_p95_ms" in s["efim"] and s["efim"]["context_frac_mean"] > 0
    efim_rows = res["rows"]["efim"]
    assert all("context_middle_tokens" in r for r in efim_rows if "context_prefix_tokens" in r)
    # the time since the request's file opened (the click trace opens its first file at 0, typing 3 s on)
    assert all(r["since_open_s"] == r["t"] for r in efim_rows) and efim_rows[0]["since_open_s"] >= 3
    settled = [r["context_prefix_tokens"] + r["context_suffix_tokens"] for r in efim_rows
               if "context_prefix_tokens" in r and r["since_open_s"] >= paced.SETTLED_S]
    assert not settled or s["efim"]["context_median_tokens_5s"] in settled


def test_context_part_scores_each_planned_request(tiny_model):
    cfg = context.ContextConfig(tiny_model, scorer=tiny_model, trace="click", max_requests=15, n_boot=50, busy=True)
    res = context.run(cfg)
    assert res["busy"] and "one core kept busy" in context.table(res)  # (efim bench context --busy)
    assert res["scored"] >= 5 and res["scored"] + sum(res["skipped"].values()) == 15
    by = {(x["requests"], x["context"]): x for x in res["summary"]}
    used, full, vim = by["planned", "used"], by["planned", "full"], by["planned", "llama.vim"]
    # The first change is near the file's top: the whole head is in each window.
    assert used["tokens_mean"] <= full["tokens_mean"] == vim["tokens_mean"] and full["tokens_mean"] > 200
    for x in res["summary"]:
        assert x["ci95_lo"] <= x["bpc"] <= x["ci95_hi"] and x["bpc"] > 0
    assert all(len(r["target"]) <= 32 and "\n" not in r["target"] for r in res["rows"])
    assert "used - full" in context.table(res)


def test_paced_replay_with_repository_context_reports_its_tiers(tiny_model, tmp_path):
    """``efim bench paced --repo-context DIR``: the trace's files are opened under a git tree, the daemon puts
    repository context before them, and no request prefills that context again."""
    import subprocess

    from efim_local.bench import trace

    root = tmp_path / "project"
    for c in trace.load(trace.resolve("efim")):  # the traced files as they first were, in a git work tree
        p = root / c.file
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            p.write_text(c.before)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    res = paced.run(paced.PacedConfig(tiny_model, max_requests=20, max_tokens=4, n_ctx=4096, threads=1, repo=root))
    s = res["summary"][0]
    assert all(r["path"].startswith(str(root.resolve())) for r in res["rows"]["efim"])
    assert s["repo_requests"] > 0 and s["repo_t0_tokens_mean"] > 0 and s["repo_t1_tokens_mean"] > 0
    assert s["repo_lead_prefilled_again"] == {}, s
