"""Sub-token evaluation: how well a model continues the text at a cursor that sits mid-word, against
one at a word boundary, for each prompt layout and with and without token healing.

For every cursor (sampled, seeded, from code no model here trained on) and condition, it measures

- bits per character of the true next characters (up to --chars of the rest of the line), the
  probability taken through the tokenization the engine's prompt has (efim_local.bench.subtoken
  and docs/models.md define it exactly);
- exact match of the rest of the word and of the rest of the line under greedy decoding (the
  engine's healing code path picks the healed tokens);

with bootstrap 95% intervals, for two cursor classes: mid-word and word boundary.

Conditions: a FIM-tokened model (the bundled fragment-trained default, the no-fragment baseline)
under the FIM and EFIM layouts, each with and without healing; gemma3-270m (no FIM training)
left to right on the text before the cursor, with and without healing. Each model runs on its own
(results saved per model), then --report merges them into the table and chart of docs/models.md:

    python scripts/eval_subtoken.py --model default                 # ~25 min on 2 quiet cores
    python scripts/eval_subtoken.py --model out/nofrag/model.gguf --name nofrag
    python scripts/eval_subtoken.py --model gemma --cursors 2000
    python scripts/eval_subtoken.py --report default nofrag gemma   # table + docs/subtoken.png
"""

import argparse
import json
import random
import sysconfig
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from efim_local.bench import util as bu
from efim_local.bench.subtoken import CLASSES, bootstrap, infill_job, l2r_job, sample_cursors
from efim_local.bench.subtoken_score import Scorer
from efim_local.config import Config, ContextParams
from efim_local.engine.engine import make_planner
from efim_local.llama import Context, Model
from efim_local.training.corpus import stdlib_files

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--name", default=None, help="results name (default: the --model value)")
ap.add_argument("--cursors", type=int, default=5000, help="cursors per class (half from each corpus)")
ap.add_argument("--chars", type=int, default=16, help="characters scored after the cursor (at most)")
ap.add_argument("--prefix-tokens", type=int, default=128, help="context before the cursor's line")
ap.add_argument("--suffix-tokens", type=int, default=64, help="context after the cursor's line (FIM layouts)")
ap.add_argument("--l2r-tokens", type=int, default=24, help="context before the cursor, left-to-right models")
ap.add_argument("--max-new", type=int, default=40, help="greedy tokens at most")
ap.add_argument("--capacity", type=int, default=600,
                help="tokens per decode group (small groups: attention spans only their cells)")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--report", nargs="*", default=None, help="merge these saved results into a table and chart")
ap.add_argument("--chart", default="docs/subtoken.png")
args = ap.parse_args()



def show(rows: list[dict]) -> None:
    """Print the summary rows as a table."""
    cols = ["model", "condition", "class", "cursors", "bits/char", "95% CI", "EM word %", "95% CI ", "EM line %"]
    print(bu.table([{**r, "95% CI": r["bpc_ci"], "95% CI ": r.get("word_ci", "")} for r in rows], cols))


# -- report mode: merge saved per-model results ---------------------------------------------------------
if args.report is not None:
    rows, per = [], {}
    for name in args.report:
        data = json.loads((bu.RESULTS / f"subtoken-{name}.json").read_text())
        per[name] = data
        rows += data["summary"]
    show(rows)
    for name, data in per.items():
        for line in data.get("findings", []):
            print(f"{name}: {line}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = lambda cond: "C2" if "heal" in cond else "C7" if "oracle" in cond else "C0"
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
    fig.savefig(args.chart, dpi=110)
    print("chart", args.chart)
    raise SystemExit(0)

# -- held-out code: the standard library's test/ (training skipped it) and third-party packages ---------
site = Path(sysconfig.get_paths()["purelib"])
corpora = {
    "stdlib-test": [p for p in stdlib_files(50_000_000, include_tests=True) if "test" in p.parts],
    "third-party": sorted([*(site / "click").rglob("*.py"), *(site / "sqlite_utils").rglob("*.py")]),
}
texts, cursors = [], []
rng = random.Random(args.seed)
for corpus, files in corpora.items():
    docs = [p.read_text("utf-8", errors="replace") for p in files]
    base = len(texts)
    texts += docs
    for cls in CLASSES:
        for c in sample_cursors(docs, cls, args.cursors // 2, rng, corpus):
            cursors.append(c.__class__(c.corpus, base + c.doc, c.offset, c.cls, c.line_start, c.eol))
print(f"{len(cursors)} cursors: " + ", ".join(f"{sum(c.cls == k for c in cursors)} {k}" for k in CLASSES))

# -- the model, its prompts, its scorer -------------------------------------------------------------------
path, template = bu.bench_model(args.model)
name = args.name or args.model
model = Model(path)
l2r = template is not None  # a model without FIM tokens: scored left to right
# One thread: under load, ggml's thread barriers cost more than a second thread gains.
ctx = Context(model, ContextParams(n_ctx_seq=64, n_slots=128, n_batch=2048, kv_unified=True,
                                   n_threads=1, n_threads_batch=1))
if l2r:
    conditions = {"L2R": None}
    stop_tokens = frozenset()
else:
    tmpl, planner = make_planner(model, Config(model=str(path)))
    conditions = {"FIM": "fim", "EFIM": "efim"}
    stop_tokens = tmpl.stop_tokens
scorer = Scorer(model, ctx, stop_tokens, max_seqs=128, max_new=args.max_new, capacity=args.capacity)


def job(c, layout):
    if layout is None:
        return l2r_job(model, texts[c.doc], c, args.l2r_tokens, args.chars)
    return infill_job(planner, texts[c.doc], c, layout, args.prefix_tokens, args.suffix_tokens, args.chars)


# -- score every cursor under every condition ---------------------------------------------------------------
t0 = time.perf_counter()
raw: dict[str, list] = {cond: [] for cond in conditions}
step = 16
for i in tqdm(range(0, len(cursors), step), desc=name, unit_scale=step):
    part = cursors[i:i + step]
    for cond, layout in conditions.items():
        raw[cond] += scorer.score([job(c, layout) for c in part])
elapsed = time.perf_counter() - t0

# -- summarise: bits/char and exact match, per class, with bootstrap intervals -------------------------------
summary, findings = [], []
# Cursors a condition could not score (None: too many token prefixes) are dropped from every condition.
keep = [i for i in range(len(cursors)) if all(res[i] is not None for res in raw.values())]
print(f"{len(cursors) - len(keep)} cursors dropped (targets with more token prefixes than sequences)")
cursors = [cursors[i] for i in keep]
raw = {cond: [res[i] for i in keep] for cond, res in raw.items()}
cls_of = np.array([c.cls for c in cursors])
arr = {}
for cond, res in raw.items():
    a = {k: np.array([getattr(r, k) for r in res], dtype=np.float64)
         for k in ("bits_u", "bits_h", "bits_o", "chars", "em_word_u", "em_line_u", "em_word_h", "em_line_h", "healed")}
    arr[cond] = a
    for cls in CLASSES:
        m = cls_of == cls
        for label, bits, word, line in ((cond, "bits_u", "em_word_u", "em_line_u"),
                                        (cond + "+heal", "bits_h", "em_word_h", "em_line_h"),
                                        (cond + " oracle", "bits_o", None, None)):
            bpc = bootstrap(a[bits][m], ratio_of=a["chars"][m], seed=args.seed)
            row = {"model": name, "condition": label, "class": cls, "cursors": int(m.sum()),
                   "bits/char": bpc[0], "bpc_lo": bpc[1], "bpc_hi": bpc[2], "bpc_ci": f"{bpc[1]:.3f}-{bpc[2]:.3f}"}
            if word:
                w, ln = bootstrap(100 * a[word][m], seed=args.seed), bootstrap(100 * a[line][m], seed=args.seed)
                row.update({"EM word %": w[0], "word_ci": f"{w[1]:.1f}-{w[2]:.1f}", "EM line %": ln[0],
                            "line_ci": f"{ln[1]:.1f}-{ln[2]:.1f}"})
            summary.append(row)

mid = cls_of == "mid-word"
for cond, a in arr.items():
    # Sub-token loss U - O and healing's share of it, (U - H) / (U - O), over mid-word cursors.
    loss = bootstrap((a["bits_u"] - a["bits_o"])[mid], ratio_of=a["chars"][mid], seed=args.seed)
    share = bootstrap((a["bits_u"] - a["bits_h"])[mid], ratio_of=(a["bits_u"] - a["bits_o"])[mid], seed=args.seed)
    findings.append(f"{cond} mid-word: sub-token loss U-O {loss[0]:.3f} bits/char "
                    f"(95% CI {loss[1]:.3f}-{loss[2]:.3f}); "
                    f"healing recovers {100 * share[0]:.0f}% of it ({100 * share[1]:.0f}-{100 * share[2]:.0f}%); "
                    f"healing applies at {100 * a['healed'][mid].mean():.0f}% of mid-word cursors")
gaps = {}  # the paper's comparison: EFIM - FIM, paired over the same cursors
if "EFIM" in arr:
    for cls in CLASSES:
        m = cls_of == cls
        gap = bootstrap((arr["EFIM"]["bits_u"] - arr["FIM"]["bits_u"])[m], ratio_of=arr["FIM"]["chars"][m],
                        seed=args.seed)
        findings.append(f"EFIM - FIM at {cls} cursors: {gap[0]:+.3f} bits/char (95% CI {gap[1]:+.3f} to {gap[2]:+.3f})")
        gaps[cls] = gap

show(summary)
print("\n".join(findings))
print(f"{len(cursors)} cursors x {len(conditions)} prompt layouts in {elapsed / 60:.1f} min")
per_cursor = {cond: {k: v.tolist() for k, v in a.items()} for cond, a in arr.items()}
print("saved", bu.save(f"subtoken-{name}", {
    "args": vars(args), "model": str(path), "minutes": elapsed / 60, "summary": summary, "findings": findings,
    "gaps": gaps, "cursors": [[c.corpus, c.cls, c.offset] for c in cursors], "per_cursor": per_cursor}))
