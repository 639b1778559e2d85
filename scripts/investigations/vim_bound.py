"""Can any context efim has beat llama.vim's window? (issue 23's last acceptance condition)

`efim bench context` scores the text typed next under the plan efim used, its full plan, and
llama.vim's window (256 lines before the cursor, 64 after). A plan efim answers from is cut from its
full plan, so it can beat llama.vim's window only if the full plan, or context from outside the file,
holds something the window lacks. This script scores, on the same requests as the bench (the trace's
paced replay, no daemon: the contexts depend on the cursor only), the text typed next with gemma3-270m
after the left context of:

- ``llama.vim``: llama.vim's window;
- ``full 4k`` / ``full 8k``: efim's full plan with a slot of 4,096 (the default) or 8,192 tokens;
- ``repo + llama.vim``: the repository context efim's daemon adds with ``repo_context = true`` (T0:
  the project map; T1: the definitions the file uses, built from ``--tree``, a work tree of the
  trace's project; in plain text, the format a model without repository tokens gets) before the window;
- ``repo + full 4k``: the same lead inside a 4,096-token slot (the file keeps the room the lead leaves).

Printed: bits per character, and each one's paired difference from llama.vim's window, relative, with a
95% bootstrap interval over requests (negative: better than llama.vim's window).

    pip download click==8.1.0 --no-binary :all: --no-deps -d /tmp/dl     # the click trace's project
    mkdir -p /tmp/clicktree && tar -xzf /tmp/dl/click-8.1.0.tar.gz -C /tmp/clicktree --strip-components=1
    python scripts/investigations/vim_bound.py --trace click --tree /tmp/clicktree \\
        --model qwen2.5-coder-0.5b-random-q8_0.gguf
    git archive 2008ac1dd03d^ | tar -x -C /tmp/efimtree                   # the efim trace's project
    python scripts/investigations/vim_bound.py --trace efim --tree /tmp/efimtree --requests 200 --model ...
"""

import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from efim_local.bench import context as cx
from efim_local.bench import paced
from efim_local.bench import trace as tr
from efim_local.bench import util as bu
from efim_local.bench.score import Scorer
from efim_local.bench.subtoken import bootstrap
from efim_local.prompt.repo_format import FORMATS, render
from efim_local.repo import RepoIndex, file_context, project_map

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--trace", default="click")
ap.add_argument("--requests", type=int, default=500, help="the paced replay's first N requests, as the bench")
ap.add_argument("--tree", type=Path, required=True, help="a work tree of the trace's project (repository context)")
ap.add_argument("--model", type=Path, required=True, help="efim's model: its tokenizer cuts the plans")
ap.add_argument("--scorer", type=Path, default=None, help="default: gemma3-270m")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--out", type=Path, default=None, help="JSON of the rows and the summary")
args = ap.parse_args()

# -- the requests: the same as the context bench's ---------------------------------------------------------
pacing = paced.Pacing()
steps = paced.steps(tr.load(tr.resolve(args.trace)), pacing)
fired = paced.requests(steps, pacing, args.requests)
index = RepoIndex.build(args.tree, args.tree.name)
t0 = project_map(index)
fmt = FORMATS["text"]
texts = {n: cx.Texts(args.model, n) for n in (4096, 8192)}
print(f"{args.trace}: {len(fired)} requests; {len(index.files)} files under {args.tree}, T0 {len(t0.pieces)} files")


def lead(path: str, doc: str) -> str:
    """The daemon's repository lead for ``path`` (T0, T1 on the buffer as it is), as plain text."""
    t1 = file_context(index, path, doc)
    return "".join(text for text, _ in render(fmt, args.tree.name, [t0.pieces, t1.pieces], path))


def full_left(n_ctx: int, doc: str, cursor: int, lead: int = 0) -> str:
    """The left text of efim's full plan at ``cursor`` in a slot of ``n_ctx`` after ``lead`` tokens."""
    return texts[n_ctx].texts(doc, cursor, *texts[n_ctx].counts_full(doc, cursor, lead))[0]


# -- scoring ---------------------------------------------------------------------------------------------
names = ("llama.vim", "full 4k", "full 8k", "repo + llama.vim", "repo + full 4k")
bits = {k: [] for k in names}
tokens = {k: [] for k in names}
chars, rows = [], []
with Scorer(args.scorer or bu.gemma_path(), n_ctx=10240, threads=args.threads, n_seqs=len(names)) as scorer:
    limit = scorer.n_ctx - 64
    for f in tqdm(fired, desc="scoring"):
        target = cx.typed_next(steps, f.step, 32)
        if not target.strip():
            continue
        window = cx.vim_window(f.doc, f.cursor)[0]
        head = lead(f.path, f.doc)
        head_tokens = len(texts[4096].model.tokenize(head))  # what the lead takes of the slot
        sides = {"llama.vim": window, "full 4k": full_left(4096, f.doc, f.cursor),
                 "full 8k": full_left(8192, f.doc, f.cursor), "repo + llama.vim": head + window,
                 "repo + full 4k": head + full_left(4096, f.doc, f.cursor, head_tokens)}
        target_tokens = scorer.tokenize(target)
        for seq, k in enumerate(names):
            prompt = cx.prompt_tokens(scorer, sides[k], "", "left", limit)
            bits[k].append(scorer.bits(prompt, target_tokens, seq))
            tokens[k].append(len(prompt))
        chars.append(len(target))
        rows.append({"t": steps[f.step].t, "path": f.path, "target": target,
                     **{f"bits {k}": bits[k][-1] for k in names}, **{f"tokens {k}": tokens[k][-1] for k in names}})
for t in texts.values():
    t.close()

# -- the summary -----------------------------------------------------------------------------------------
vim = np.array(bits["llama.vim"])
summary = []
for k in names:
    b = np.array(bits[k])
    est, lo, hi = bootstrap(b - vim, ratio_of=vim, n=2000)
    summary.append({"context": k, "tokens_mean": round(float(np.mean(tokens[k]))),
                    "bpc": round(b.sum() / sum(chars), 4),
                    "vs_llama.vim_pct": round(100 * est, 2), "ci95_lo_pct": round(100 * lo, 2),
                    "ci95_hi_pct": round(100 * hi, 2)})
print(f"{len(chars)} requests scored ({sum(chars)} characters typed next), scorer "
      f"{Path(args.scorer or bu.gemma_path()).name}, left context")
print(bu.table(summary, list(summary[0])))
if args.out:
    args.out.write_text(json.dumps({"trace": args.trace, "tree": str(args.tree), "summary": summary, "rows": rows}))
