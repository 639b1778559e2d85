"""What the tokens nearest the cursor are worth: bits per character by how many of them (issue 23).

For each request of a paced trace (as `efim bench context` fires them), the text the user
typed next (to the line end, at most 32 characters) is scored by gemma3-270m after the N prefix tokens
nearest the cursor (by the replay model's tokenizer; left context only, as the context bench's
``form="left"``), for N = 32, 64, ... and the full plan's prefix. No daemon runs: this is the curve
the near window's size is chosen on (`prompt/windows.py`, `NEAR_SHARES`).

    python scripts/investigations/context_curve.py --trace efim --model qwen2.5-coder-0.5b-random-q8_0.gguf

About 4 s a request on one core (seven prompts of up to 6k tokens each).
"""

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from efim_local.bench import paced, trace as tr, util as bu
from efim_local.bench.context import Texts, prompt_tokens, typed_next
from efim_local.bench.score import Scorer

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--trace", default="efim", help="efim, click, or a trace file")
ap.add_argument("--model", type=Path, required=True, help="the replay model (its tokenizer counts the tokens)")
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--n-ctx", type=int, default=4096, help="the slot the full plan fits")
ap.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
ap.add_argument("--out", type=Path, default=Path("bench-results/context-curve.json"))
args = ap.parse_args()

# -- the requests, and the text typed after each --------------------------------------------------
pacing = paced.Pacing()
steps = paced.steps(tr.load(tr.resolve(args.trace)), pacing)
fired = paced.requests(steps, pacing, args.requests)
texts = Texts(args.model, args.n_ctx)

# -- score each after the N tokens nearest the cursor ---------------------------------------------
names = [str(n) for n in args.tokens] + ["full"]
rows = []
try:
    with Scorer(bu.gemma_path(), n_ctx=6144, threads=1, n_seqs=len(names)) as scorer:
        for f in tqdm(fired, desc="scoring"):
            target = typed_next(steps, f.step, 32)
            if not target.strip():
                continue
            full_left = texts.counts_full(f.doc, f.cursor)[0]
            row = {"t": f.t, "path": f.path, "chars": len(target), "full_left": full_left}
            for seq, (name, n) in enumerate(zip(names, [*args.tokens, full_left])):
                left, _ = texts.texts(f.doc, f.cursor, min(n, full_left), 0)
                prompt = prompt_tokens(scorer, left, "", "left", scorer.n_ctx - 64)
                row[name] = scorer.bits(prompt, scorer.tokenize(target), seq)
            rows.append(row)
finally:
    texts.close()

# -- mean bits per character, and the loss against the full plan ----------------------------------
chars = sum(r["chars"] for r in rows)
full = sum(r["full"] for r in rows) / chars
table = [{"tokens": name, "bpc": sum(r[name] for r in rows) / chars} for name in names]
for t in table:
    t["vs_full_pct"] = 100 * (t["bpc"] / full - 1)
print(f"{len(rows)} requests scored ({chars} characters), trace {args.trace}, replay tokenizer {args.model.name}")
print(bu.table(table, ["tokens", "bpc", "vs_full_pct"]))
args.out.parent.mkdir(parents=True, exist_ok=True)
args.out.write_text(json.dumps({"trace": args.trace, "model": str(args.model), "table": table, "rows": rows}))
print(f"saved {args.out}")
