"""Sub-token evaluation (`efim bench subtoken`): how well a model continues the text at a cursor that
sits mid-word, against one at a word boundary, for each prompt layout and with and without token
healing.

For every cursor (sampled, seeded, from code no model here trained on) and condition, it measures

- bits per character of the true next characters (up to ``chars`` of the rest of the line), the
  probability taken through the tokenization the engine's prompt has (subtoken.py and
  docs/models.md define it exactly; subtoken_score.py computes it);
- exact match of the rest of the word and of the rest of the line under greedy decoding (the
  engine's healing code path picks the healed tokens);

with bootstrap 95% intervals, for two cursor classes: mid-word and word boundary.

Conditions: a FIM-tokened model under the FIM and EFIM layouts, each with and without healing; a
model without FIM tokens (gemma3-270m) left to right on the text before the cursor, with and without
healing. Each model runs on its own (results saved per model); :func:`report` merges them into the
table and chart of docs/models.md.
"""

from __future__ import annotations

import json
import random
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import util as bu
from .subtoken import CLASSES, bootstrap, infill_job, l2r_job, sample_cursors


@dataclass
class SubtokenConfig:
    model: str = "default"
    name: str | None = None  # results name (None: the model value)
    cursors: int = 5000  # per class (half from each corpus)
    chars: int = 16  # characters scored after the cursor (at most)
    prefix_tokens: int = 128  # context before the cursor's line
    suffix_tokens: int = 64  # context after the cursor's line (FIM layouts)
    l2r_tokens: int = 24  # context before the cursor, left-to-right models
    max_new: int = 40  # greedy tokens at most
    capacity: int = 600  # tokens per decode group (small groups: attention spans only their cells)
    seed: int = 0
    out: Path = bu.RESULTS


def show(rows: list[dict]) -> str:
    """The summary rows as a table."""
    cols = ["model", "condition", "class", "cursors", "bits/char", "95% CI", "EM word %", "95% CI ", "EM line %"]
    return bu.table([{**r, "95% CI": r["bpc_ci"], "95% CI ": r.get("word_ci", "")} for r in rows], cols)


def held_out(cfg: SubtokenConfig):
    """Held-out code: the standard library's test/ (training skipped it) and third-party packages;
    (texts, cursors)."""
    from ..training.corpus import stdlib_files

    site = Path(sysconfig.get_paths()["purelib"])
    corpora = {
        "stdlib-test": [p for p in stdlib_files(50_000_000, include_tests=True) if "test" in p.parts],
        "third-party": sorted([*(site / "click").rglob("*.py"), *(site / "sqlite_utils").rglob("*.py")]),
    }
    texts, cursors = [], []
    rng = random.Random(cfg.seed)
    for corpus, files in corpora.items():
        docs = [p.read_text("utf-8", errors="replace") for p in files]
        base = len(texts)
        texts += docs
        for cls in CLASSES:
            for c in sample_cursors(docs, cls, cfg.cursors // 2, rng, corpus):
                cursors.append(c.__class__(c.corpus, base + c.doc, c.offset, c.cls, c.line_start, c.eol))
    return texts, cursors


def score(cfg: SubtokenConfig, texts, cursors, log=print):
    """Every cursor under every condition of the model: (model path, {condition: [Result or None]}, s)."""
    from ..config import Config
    from ..engine.engine import make_planner
    from ..llama import Context, ContextParams, Model
    from .subtoken_score import Scorer

    path, template = bu.bench_model(cfg.model)
    model = Model(path)
    l2r = template is not None  # a model without FIM tokens: scored left to right
    # One thread: under load, ggml's thread barriers cost more than a second thread gains.
    ctx = Context(model, ContextParams(n_ctx_seq=64, n_slots=128, n_batch=2048, kv_unified=True,
                                       n_threads=1, n_threads_batch=1))
    scorer = None
    try:
        if l2r:
            conditions, stop_tokens, planner = {"L2R": None}, frozenset(), None
        else:
            tmpl, planner = make_planner(model, Config(model=str(path)))
            conditions, stop_tokens = {"FIM": "fim", "EFIM": "efim"}, tmpl.stop_tokens
        scorer = Scorer(model, ctx, stop_tokens, max_seqs=128, max_new=cfg.max_new, capacity=cfg.capacity)

        def job(c, layout):
            if layout is None:
                return l2r_job(model, texts[c.doc], c, cfg.l2r_tokens, cfg.chars)
            return infill_job(planner, texts[c.doc], c, layout, cfg.prefix_tokens, cfg.suffix_tokens, cfg.chars)

        t0 = time.perf_counter()
        raw: dict[str, list] = {cond: [] for cond in conditions}
        step = 16
        for i in tqdm(range(0, len(cursors), step), desc=cfg.name or cfg.model, unit_scale=step,
                      disable=log is None):
            part = cursors[i:i + step]
            for cond, layout in conditions.items():
                raw[cond] += scorer.score([job(c, layout) for c in part])
        return path, raw, time.perf_counter() - t0
    finally:
        if scorer is not None:
            scorer.batch.close()
        ctx.close()
        model.close()


def run(cfg: SubtokenConfig, log=print) -> dict:
    """Score one model; the summary rows, findings and paired gaps, saved as subtoken-NAME.json."""
    name = cfg.name or cfg.model
    texts, cursors = held_out(cfg)
    if log is not None:
        log(f"{len(cursors)} cursors: " + ", ".join(f"{sum(c.cls == k for c in cursors)} {k}" for k in CLASSES))
    path, raw, elapsed = score(cfg, texts, cursors, log)

    # Cursors a condition could not score (None: too many token prefixes) are dropped from every condition.
    keep = [i for i in range(len(cursors)) if all(res[i] is not None for res in raw.values())]
    if log is not None:
        log(f"{len(cursors) - len(keep)} cursors dropped (targets with more token prefixes than sequences)")
    cursors = [cursors[i] for i in keep]
    raw = {cond: [res[i] for i in keep] for cond, res in raw.items()}
    cls_of = np.array([c.cls for c in cursors])
    summary, findings, arr = [], [], {}
    for cond, res in raw.items():
        a = {k: np.array([getattr(r, k) for r in res], dtype=np.float64)
             for k in ("bits_u", "bits_h", "bits_o", "chars", "em_word_u", "em_line_u", "em_word_h", "em_line_h",
                       "healed")}
        arr[cond] = a
        for cls in CLASSES:
            m = cls_of == cls
            for label, bits, word, line in ((cond, "bits_u", "em_word_u", "em_line_u"),
                                            (cond + "+heal", "bits_h", "em_word_h", "em_line_h"),
                                            (cond + " oracle", "bits_o", None, None)):
                bpc = bootstrap(a[bits][m], ratio_of=a["chars"][m], seed=cfg.seed)
                row = {"model": name, "condition": label, "class": cls, "cursors": int(m.sum()),
                       "bits/char": bpc[0], "bpc_lo": bpc[1], "bpc_hi": bpc[2],
                       "bpc_ci": f"{bpc[1]:.3f}-{bpc[2]:.3f}"}
                if word:
                    w, ln = bootstrap(100 * a[word][m], seed=cfg.seed), bootstrap(100 * a[line][m], seed=cfg.seed)
                    row.update({"EM word %": w[0], "word_ci": f"{w[1]:.1f}-{w[2]:.1f}", "EM line %": ln[0],
                                "line_ci": f"{ln[1]:.1f}-{ln[2]:.1f}"})
                summary.append(row)

    mid = cls_of == "mid-word"
    for cond, a in arr.items():
        # Sub-token loss U - O and healing's share of it, (U - H) / (U - O), over mid-word cursors.
        loss = bootstrap((a["bits_u"] - a["bits_o"])[mid], ratio_of=a["chars"][mid], seed=cfg.seed)
        share = bootstrap((a["bits_u"] - a["bits_h"])[mid], ratio_of=(a["bits_u"] - a["bits_o"])[mid], seed=cfg.seed)
        findings.append(f"{cond} mid-word: sub-token loss U-O {loss[0]:.3f} bits/char "
                        f"(95% CI {loss[1]:.3f}-{loss[2]:.3f}); "
                        f"healing recovers {100 * share[0]:.0f}% of it ({100 * share[1]:.0f}-{100 * share[2]:.0f}%); "
                        f"healing applies at {100 * a['healed'][mid].mean():.0f}% of mid-word cursors")
    gaps = {}  # the paper's comparison: EFIM - FIM, paired over the same cursors
    if "EFIM" in arr:
        for cls in CLASSES:
            m = cls_of == cls
            gap = bootstrap((arr["EFIM"]["bits_u"] - arr["FIM"]["bits_u"])[m], ratio_of=arr["FIM"]["chars"][m],
                            seed=cfg.seed)
            findings.append(f"EFIM - FIM at {cls} cursors: {gap[0]:+.3f} bits/char "
                            f"(95% CI {gap[1]:+.3f} to {gap[2]:+.3f})")
            gaps[cls] = gap

    per_cursor = {cond: {k: v.tolist() for k, v in a.items()} for cond, a in arr.items()}
    res = {"args": bu.options(cfg), "model": str(path), "minutes": elapsed / 60, "summary": summary,
           "findings": findings, "gaps": gaps, "cursors": [[c.corpus, c.cls, c.offset] for c in cursors],
           "per_cursor": per_cursor}
    res["json"] = str(bu.save(f"subtoken-{name}", res, cfg.out))
    if log is not None:
        log(show(summary))
        log("\n".join(findings))
        log(f"{len(cursors)} cursors x {len(raw)} prompt layouts in {elapsed / 60:.1f} min")
    return res


def report(names: list[str], results: Path, chart: Path, log=print) -> dict:
    """Merge saved per-model results (``results``/subtoken-NAME.json) into one table and a chart."""
    rows, per = [], {}
    for name in names:
        data = json.loads((results / f"subtoken-{name}.json").read_text())
        per[name] = data
        rows += data["summary"]
    findings = [f"{name}: {line}" for name, data in per.items() for line in data.get("findings", [])]
    if log is not None:
        log(show(rows))
        log("\n".join(findings))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("the chart needs matplotlib: pip install -e '.[bench]'") from None

    colour = lambda cond: "C2" if "heal" in cond else "C7" if "oracle" in cond else "C0"  # noqa: E731
    fig, axes = plt.subplots(1, len(CLASSES), figsize=(11, 4.2), sharey=True)
    for ax, cls in zip(axes, CLASSES):
        sel = [r for r in rows if r["class"] == cls]
        x = np.arange(len(sel))
        est = np.array([r["bits/char"] for r in sel])
        lo = est - np.array([r["bpc_lo"] for r in sel])
        hi = np.array([r["bpc_hi"] for r in sel]) - est
        ax.bar(x, est, yerr=[lo, hi], capsize=3, color=[colour(r["condition"]) for r in sel])
        ax.set_xticks(x, [f"{r['model']}\n{r['condition']}" for r in sel], rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{cls} cursors")
        ax.set_ylabel("bits per character (lower is better)")
    fig.tight_layout()
    chart.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(chart, dpi=110)
    plt.close(fig)
    if log is not None:
        log(f"chart {chart}")
    return {"summary": rows, "findings": findings, "chart": str(chart)}
