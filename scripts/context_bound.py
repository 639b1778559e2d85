"""An upper bound on the paced replay's mean context share, for a given prefill speed (issue 23).

The paced replay (`efim bench --only paced`) reports each answer's context as a share of its full plan.
How high can that share go on a machine that prefills S tokens a second, if answers must stay exact
(KV reused only where the tokens before it are the same, so a plan's suffix is recomputed whenever
its anchor moves)? This script replays the same trace through an oracle that is better than any
scheduler:

- it spends *all* the time between events prefilling the current file's plan at S tokens a second
  (no time generating answers, none lost to interruptions);
- it keeps one anchor per hunk (the line where the cursor lands after a jump), so typing never
  moves it;
- after a jump it keeps exactly the tokens of its old plan that the new plan starts with;
- its plans are the planner's full plans (`Planner.space` for the slot, the same prefix/suffix split
  as `Planner._fit` for files bigger than a slot).

Its mean share is an upper bound for efim at that speed: if the bound is under a target, no
scheduling meets the target on that machine without giving up exactness.

    python scripts/context_bound.py --trace click --speed 173      # the 0.5B shape's best batch rate here
    python scripts/context_bound.py --trace efim --speed 150 87
"""

import argparse
from pathlib import Path

from efim_local.bench import paced
from efim_local.bench import trace as tr
from efim_local.config import Config, ContextParams
from efim_local.engine.engine import make_planner  # scripts sit above every layer
from efim_local.llama import Model

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--trace", default="efim", help="'efim', 'click' or a trace file")
ap.add_argument("--model", type=Path, required=True, help="the GGUF whose vocabulary plans (e.g. the 0.5B shape)")
ap.add_argument("--speed", type=float, nargs="+", required=True, help="prefill tokens per second (one or more)")
ap.add_argument("--n-ctx", type=int, default=4096, help="tokens per slot, as the paced replay's --n-ctx")
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--max-tokens", type=int, default=16, help="the answer's room, as the paced replay's")
args = ap.parse_args()

# -- the trace, as the paced replay fires it ---------------------------------------------------------
steps = paced.steps(tr.load(tr.resolve(args.trace)))
fired = paced.requests(steps, paced.Pacing(), args.requests)
full = paced.full_tokens(args.model, fired, args.n_ctx)  # the replay's denominators

# -- the oracle's plans: one per hunk ----------------------------------------------------------------
model = Model(args.model, vocab_only=True)
_, planner = make_planner(model, Config(model=str(args.model), context=ContextParams(n_ctx_seq=args.n_ctx)))
space = planner.space(args.max_tokens)


def hunk_plan(doc: str, cursor: int) -> list[int]:
    """The full plan's prefix (to the cursor's line start) and suffix, fitted to the slot."""
    anchor = doc.rfind("\n", 0, cursor) + 1
    pre, suf = model.tokenize(doc[:anchor]), model.tokenize(doc[cursor:])
    keep_suffix = min(len(suf), max(space // 4, space - len(pre)))
    return pre[max(0, len(pre) - (space - keep_suffix)):] + suf[:keep_suffix]


plans = {}  # step index -> the plan of the hunk that starts there
for k, s in enumerate(steps):
    if s.kind in ("open", "jump"):
        plans[k] = hunk_plan(s.doc, s.cursor)

for speed in args.speed:
    shares, held, cached, since = [], {}, {}, {}
    k = 0
    for f, denominator in zip(fired, full):
        for j in range(k, f.step + 1):  # the jumps before this request: keep what the new plan starts with
            s = steps[j]
            if j in plans:
                new, old = plans[j], held.get(s.path, [])
                if s.path in since:  # what was prefilled since the file's last event counts too
                    cached[s.path] = min(len(old), cached[s.path] + speed * (s.t - since[s.path]))
                n = 0
                limit = min(len(old), len(new), int(cached.get(s.path, 0)))
                while n < limit and old[n] == new[n]:
                    n += 1
                held[s.path], cached[s.path], since[s.path] = new, n, s.t
        k = f.step + 1
        cached[f.path] = min(len(held[f.path]), cached[f.path] + speed * (f.t - since[f.path]))
        since[f.path] = f.t
        shares.append(min(1.0, cached[f.path] / max(1, denominator)))
    print(f"{args.trace} trace, {len(shares)} requests, {speed:.0f} tokens/s: "
          f"the oracle's mean context share is {sum(shares) / len(shares):.0%}")
