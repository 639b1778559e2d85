"""Speculative decoding with completion drafts (issue 24, `efim bench drafts`): decode speed with and
without drafts, and token identity, over many cursors in real files.

Cursors come from this package's sources and the click trace's files (``efim_local/data``): at each,
a block of lines is deleted (a multi-line gap, or the rest of a line and the lines after it), as when
someone writes code there. Each cursor is completed twice by one engine, plainly and with drafts
(alternating which runs first; the second reuses the first's prompt KV), at temperature 0. Decode
speed is the tokens after the first over the time after the first (``timings.predict_ms``);
"multi-line" counts the cursors whose answer spans 2 lines or more.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass
class DraftsConfig:
    model: str = "gemma"
    cursors: int = 1000
    max_tokens: int = 64
    n_ctx: int = 512  # tokens per slot (the plan's context)
    threads: int = 2
    out: Path = bu.RESULTS


def files() -> list[tuple[str, str]]:
    """(name, text) of this package's Python sources and the click trace's files (after each commit)."""
    from . import trace

    out = [(str(p.relative_to(PACKAGE.parent)), p.read_text("utf-8")) for p in sorted(PACKAGE.rglob("*.py"))]
    seen = set()
    for c in trace.load(trace.resolve("click")):
        if c.file not in seen and c.file.endswith(".py"):
            seen.add(c.file)
            out.append((f"click/{c.file}", c.after))
    return [(n, t) for n, t in out if t.count("\n") >= 40]


def cursor(i: int, corpus: list[tuple[str, str]]) -> tuple[str, str, int, str]:
    """The i-th cursor: (name, document with a gap, offset, kind)."""
    rng = random.Random(i)
    name, text = corpus[rng.randrange(len(corpus))]
    lines = text.splitlines(keepends=True)
    at = rng.randrange(10, len(lines) - 8)
    while not lines[at].strip():
        at += 1
    start = sum(len(ln) for ln in lines[:at])
    line = lines[at]
    indent = len(line) - len(line.lstrip())
    if i % 2 == 0:  # a gap of whole lines: the cursor after the first one's indentation
        n = rng.randint(1, 6)
        cut = start + indent
        end = start + sum(len(ln) for ln in lines[at:at + n]) - 1  # the last line's newline stays
        kind = "lines"
    else:  # the rest of a line and up to 2 more
        body = len(line.rstrip("\n")) - indent
        cut = start + indent + (rng.randrange(body) if body > 1 else 0)
        end = start + sum(len(ln) for ln in lines[at:at + 1 + rng.randint(0, 2)]) - 1
        kind = "mid-line"
    return name, text[:cut] + text[end:], cut, kind


def run(cfg: DraftsConfig, log=print) -> dict:
    """Every cursor plainly and with drafts; the report (saved every 50 cursors) with its JSON path."""
    from ..config import Config, ContextParams
    from ..engine import CompletionRequest, Engine

    model, template = bu.bench_model(cfg.model)
    corpus = files()
    ecfg = Config(fim_template=template, max_tokens=cfg.max_tokens, max_prompt_ms=0, answer_cache=0, store=False,
                  grow_share=0, context=ContextParams(n_ctx_seq=cfg.n_ctx, n_slots=2, n_threads=cfg.threads,
                                                      n_threads_batch=cfg.threads))
    rows, t0 = [], time.time()
    with Engine(ecfg, model) as eng, tqdm(total=cfg.cursors, desc="drafts", disable=log is None) as bar:
        for i in range(cfg.cursors):
            name, doc, cur, kind = cursor(i, corpus)
            req = CompletionRequest(doc, cur, path=f"/bench/drafts/{i}.py")
            res = {}
            for drafted in ((False, True) if i % 2 == 0 else (True, False)):
                eng.decoder.draft(drafted)
                v0 = eng.decoder.draft_stats.verifications
                out = eng.complete(req)
                res[drafted] = (out, eng.decoder.draft_stats.verifications - v0)
            (p, _), (d, nv) = res[False], res[True]
            rows.append({"i": i, "file": name, "kind": kind, "tokens": len(p.token_ids),
                         "lines": len(p.text.strip("\n").splitlines()), "reason": p.stop_reason,
                         "plain_ms": p.timings.predict_ms, "drafts_ms": d.timings.predict_ms, "verifications": nv,
                         "identical": p.token_ids == d.token_ids and p.text == d.text})
            bar.update(1)
            if (i + 1) % 50 == 0 or i + 1 == cfg.cursors:
                report = summarize(rows, cfg, model, time.time() - t0)
                bu.save("drafts", report, cfg.out)
                bar.set_postfix(identical=f"{report['identical']}/{i + 1}")
        report["draft_stats"] = eng.decoder.draft_stats.as_dict()
    report["json"] = str(bu.save("drafts", report, cfg.out))
    if log is not None:
        log(bu.table(report["table"], list(report["table"][0])))
        log(f"\n{report['identical']}/{len(rows)} cursors token-identical; JSON: {report['json']}")
    return report


def speed(rows) -> dict:
    n = sum(max(0, r["tokens"] - 1) for r in rows)
    p, d = sum(r["plain_ms"] for r in rows), sum(r["drafts_ms"] for r in rows)
    tp, td = n / p * 1e3 if p else 0.0, n / d * 1e3 if d else 0.0
    per = sorted(r["plain_ms"] / r["drafts_ms"] for r in rows if r["tokens"] >= 8 and r["drafts_ms"] > 0)
    return {"cursors": len(rows), "tokens": n, "plain_tok_s": tp, "drafts_tok_s": td,
            "speedup": td / tp if tp else float("nan"),
            "median_speedup": per[len(per) // 2] if per else float("nan"),  # per cursor: robust to stalls
            "tokens_per_verification": n / max(1, sum(r["verifications"] for r in rows))}


def summarize(rows, cfg: DraftsConfig, model, elapsed) -> dict:
    groups = {"overall": rows, "multi-line": [r for r in rows if r["lines"] >= 2],
              "single-line": [r for r in rows if r["lines"] < 2]}
    table = [{"completions": k, **speed(v)} for k, v in groups.items() if v]
    return {"model": str(model), "cursors": len(rows), "max_tokens": cfg.max_tokens, "n_ctx": cfg.n_ctx,
            "threads": cfg.threads, "identical": sum(r["identical"] for r in rows), "table": table,
            "elapsed_s": elapsed, "load_avg": os.getloadavg(), "rows": rows}
