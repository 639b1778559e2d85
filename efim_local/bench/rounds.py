"""The EFIM paper's multi-round protocol: EFIM vs FIM, both with prefix reuse.

For each source file of 2-4k tokens, with H = len(file)//2 and c = H//7: prefix = file[:c],
suffix = file[H:], and in round r the text typed so far is file[c : H/7*(r+2)]. Every round asks
for ``max_tokens`` tokens (EOS ignored, temperature 0.2, top-p 0.95, top-k 20). Files take turns,
one slot each, as concurrent users would.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from . import util as bu
from ..llama import ContextParams
from ..config import Config
from ..engine.engine import CompletionRequest, Engine


def run(model: Path, template: str | None, files: int = 4, rounds: int = 5, max_tokens: int = 128,
        threads: int = 0) -> dict:
    """Both layouts over the same files; summary rows, ratios and raw rows."""
    # The middle grows by a whole chunk per round, so let it grow without re-anchoring.
    cfg = Config(model=str(model), fim_template=template, max_tokens=max_tokens, max_middle_tokens=8192,
                 context=ContextParams(n_ctx_seq=4608, n_slots=files, n_batch=512, n_threads=threads))
    results: dict[str, list[dict]] = {}
    sources: list[tuple[str, str]] = []
    for layout in ("efim", "fim"):
        with Engine(cfg, model) as engine:
            sources = sources or bu.pick_sources(engine.model.tokenize, files, 2000, 4000)
            rows = results[layout] = []
            steps = [(r, f) for r in range(rounds) for f in range(len(sources))]
            for r, f in tqdm(steps, desc=f"rounds {layout}", leave=False):
                name, text = sources[f]
                H = len(text) // 2
                end = int(H / 7 * (r + 2))
                doc = text[:end] + text[H:]
                req = CompletionRequest(doc, end, path=name, layout=layout, max_tokens=max_tokens,
                                        temperature=0.2, top_p=0.95, top_k=20, seed=r, ignore_eog=True)
                out = engine.complete(req)
                anchor = engine.session(name).anchor.offset
                rows.append({"file": name, "round": r, "middle": len(engine.model.tokenize(doc[anchor:end])),
                             "ttft_ms": out.timings.prompt_ms, "total_ms": out.timings.total_ms,
                             "prompt": out.tokens.prompt, "cached": out.tokens.cached,
                             "evaluated": out.tokens.evaluated, "reanchor": out.reanchor})
    summary = [_summary(layout, rows) for layout, rows in results.items()]
    e, f = summary
    return {"files": [n for n, _ in sources], "summary": summary,
            "ratio_ttft_mean": f["ttft_mean_ms"] / e["ttft_mean_ms"],
            "ratio_ttft_mean_later": f["ttft_mean_r1+_ms"] / e["ttft_mean_r1+_ms"], "rows": results}


def _summary(layout: str, rows: list[dict]) -> dict:
    later = [x for x in rows if x["round"] > 0]
    prev: dict[str, int] = {}
    for x in rows:  # new middle tokens: how much the middle grew since the file's last round
        x["new_middle"] = x["middle"] - prev.get(x["file"], 0)
        prev[x["file"]] = x["middle"]
    return {
        "layout": layout,
        "ttft_mean_ms": bu.mean([x["ttft_ms"] for x in rows]),
        "ttft_p95_ms": bu.pctl([x["ttft_ms"] for x in rows], 0.95),
        "ttft_mean_r1+_ms": bu.mean([x["ttft_ms"] for x in later]),
        "latency_mean_ms": bu.mean([x["total_ms"] for x in rows]),
        "cached_frac": sum(x["cached"] for x in rows) / sum(x["prompt"] for x in rows),
        "evaluated_r1+": bu.mean([x["evaluated"] for x in later]),
        "eval/new_middle_r1+": sum(x["evaluated"] for x in later) / max(1, sum(x["new_middle"] for x in later)),
    }
