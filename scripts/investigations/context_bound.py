"""An upper bound on the paced replay's mean context share, for a given prefill speed (issue 23).

The paced replay (`efim bench paced`) reports each answer's context as a share of its full plan.
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

A flat speed flatters the oracle: a request comes about every 200 ms while someone types, each costs a
decode before its first text, and a batch that fits between two requests is small, so slow per token.
``--batch-ms`` (measured ``llama_decode`` times by batch size, e.g. from ``--measure MODEL``) and
``--request-ms`` (the least a request costs: one decode of one token) give a tighter bound: the oracle
then knows every request's arrival in advance and fills each gap between two requests' first decodes
with the biggest batches that end before the next request (never making one wait). A batch is slower
the more context it follows (attention: on the 0.5B shape 16 tokens take 90 ms after 256 tokens, 200
ms after 3,840), so give tables at several context sizes (``--measure-ctx 256 1024 2048 3072 3840``):
each batch is then timed where it starts.

    python scripts/investigations/context_bound.py --trace click --speed 173   # the 0.5B shape's best batch rate here
    python scripts/investigations/context_bound.py --trace efim --speed 150 87
    python scripts/investigations/context_bound.py --trace click --measure --model M.gguf   # measured batches
    python scripts/investigations/context_bound.py --trace click --measure --model M.gguf \\
        --measure-ctx 256 1024 2048 3072 3840
"""

import argparse
from pathlib import Path

from tqdm import tqdm

from efim_local.bench import paced
from efim_local.bench import trace as tr
from efim_local.config import Config, ContextParams
from efim_local.engine.engine import make_planner  # scripts sit above every layer
from efim_local.llama import Model

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--trace", default="efim", help="'efim', 'click' or a trace file")
ap.add_argument("--model", type=Path, required=True, help="the GGUF whose vocabulary plans (e.g. the 0.5B shape)")
ap.add_argument("--speed", type=float, nargs="*", default=[], help="prefill tokens per second (one or more)")
ap.add_argument("--batch-ms", nargs="*", default=[],
                help="'[C=]B:MS,...': llama_decode ms per batch of B tokens after C tokens of context (one table "
                "per C; no C: the same at every context); gaps between requests are packed")
ap.add_argument("--request-ms", type=float, default=None, help="engine ms each request takes before the next gap")
ap.add_argument("--answer-tokens", type=int, default=0, help="each request then streams up to this many tokens "
                "at full speed (one decode each) until the next keystroke stops it")
ap.add_argument("--measure", action="store_true", help="time --model's batches on this machine (at --measure-ctx "
                "tokens of context) for --batch-ms, and a one-token decode for --request-ms")
ap.add_argument("--measure-ctx", type=int, nargs="*", default=[1024],
                help="context sizes to time batches after (several: each batch timed where it starts)")
ap.add_argument("--measure-threads", type=int, default=0, help="threads for --measure (0: all cores)")
ap.add_argument("--n-ctx", type=int, default=4096, help="tokens per slot, as the paced replay's --n-ctx")
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--max-tokens", type=int, default=16, help="the answer's room, as the paced replay's")
args = ap.parse_args()
if not args.speed and not (args.batch_ms or args.measure):
    ap.error("give --speed, --batch-ms or --measure")

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

def measure_batches(sizes=(1, 2, 4, 8, 16, 32, 64, 128), reps=5) -> dict[int, dict[int, float]]:
    """Median ms of one llama_decode of B new tokens after C cached ones, for each C of ``--measure-ctx``
    (attention makes a batch slower the more context it follows): {C: {B: ms}}."""
    import time

    import numpy as np

    from efim_local.llama import Batch, Context

    threads = args.measure_threads
    ctx = Context(Model(args.model), ContextParams(n_ctx_seq=args.n_ctx, n_slots=1, n_threads=threads,
                                                   n_threads_batch=threads))
    batch = Batch(512)
    at_most = max(args.measure_ctx)
    toks = np.random.default_rng(0).integers(100, model.n_vocab - 100, at_most + max(sizes)).tolist()
    out, pos = {}, 0
    for c in sorted(args.measure_ctx):
        for i in range(pos, c, 256):  # the context grows from one measured size to the next
            batch.clear()
            batch.extend(toks[i:min(i + 256, c)], i, 0)
            ctx.decode(batch)
        pos, out[c] = c, {}
        for b in tqdm(sizes, desc=f"batches after {c}", leave=False):
            times = []
            for _ in range(reps):
                batch.clear()
                batch.extend(toks[c:c + b], c, 0)
                batch.raw.logits[b - 1] = True
                t = time.perf_counter()
                ctx.decode(batch)
                times.append((time.perf_counter() - t) * 1e3)
                ctx.seq_rm(0, c, -1)
            out[c][b] = sorted(times)[reps // 2]
    ctx.close()
    return out


def packer(tables: dict[int, dict[int, float]]):
    """tokens(span_ms, at): how many tokens batches of the measured sizes prefill within ``span_ms`` when
    the plan's first ``at`` tokens are held (each batch's time interpolated between the measured
    contexts around its start; below the least measured context, that context's time, so measure
    from a small one; largest first, leaving out a size slower per token than a smaller one: nearly
    the most, not provably)."""
    ctxs = sorted(tables)
    sizes = sorted(set.intersection(*(set(t) for t in tables.values())))

    def ms(b: int, at: int) -> float:
        hi = next((c for c in ctxs if c >= at), ctxs[-1])
        lo = max((c for c in ctxs if c <= at), default=ctxs[0])
        if hi == lo:
            return tables[lo][b]
        w = (at - lo) / (hi - lo)
        return tables[lo][b] * (1 - w) + tables[hi][b] * w

    def tokens(span: float, at: int = 0) -> int:
        n = 0
        while True:
            best, usable = 0.0, []
            for b in sizes:
                if b / ms(b, at + n) > best:
                    usable.append(b)
                    best = b / ms(b, at + n)
            b = next((b for b in reversed(usable) if ms(b, at + n) <= span), None)
            if b is None:
                return n
            n, span = n + b, span - ms(b, at + n)
    return tokens, ms


def bound(rate) -> float:
    """The oracle's mean share when ``rate(t0, t1, at)`` tokens are prefilled for the current file from
    t0 to t1, its plan's first ``at`` tokens held."""
    shares, held, cached, since = [], {}, {}, {}
    k = 0

    def grow(path: str, t: float) -> None:  # what was prefilled since the file's last event
        cached[path] = min(len(held[path]), cached[path] + rate(since[path], t, cached[path]))
        since[path] = t

    for f, denominator in zip(fired, full):
        for j in range(k, f.step + 1):  # the jumps before this request: keep what the new plan starts with
            s = steps[j]
            if j in plans:
                new, old = plans[j], held.get(s.path, [])
                if s.path in since:
                    grow(s.path, s.t)
                n = 0
                limit = min(len(old), len(new), int(cached.get(s.path, 0)))
                while n < limit and old[n] == new[n]:
                    n += 1
                held[s.path], cached[s.path], since[s.path] = new, n, s.t
        k = f.step + 1
        grow(f.path, f.t)
        shares.append(min(1.0, cached[f.path] / max(1, denominator)))
    return sum(shares) / len(shares)


for speed in args.speed:
    share = bound(lambda t0, t1, at, speed=speed: speed * (t1 - t0))
    print(f"{args.trace} trace, {len(fired)} requests, {speed:.0f} tokens/s: "
          f"the oracle's mean context share is {share:.0%}")

if args.batch_ms or args.measure:
    if args.measure:
        tables = measure_batches()
        for c, t in tables.items():
            print(f"measured llama_decode after {c} tokens of context:",
                  ", ".join(f"{b}: {ms:.1f} ms ({b / ms * 1e3:.0f} tok/s)" for b, ms in t.items()))
    else:  # '[C=]B:MS,...' per context C (none: the same at every context)
        tables = {}
        for arg in args.batch_ms:
            c, _, table = arg.rpartition("=")
            tables[int(c or 0)] = {int(b): float(ms) for b, ms in (kv.split(":") for kv in table.split(","))}
    tokens, ms = packer(tables)
    one = min(min(t) for t in tables.values())  # the least batch: a request's own decode, an answer's token
    first = min(t[one] for t in tables.values() if one in t)  # its fastest time: generous to the oracle
    request_ms = args.request_ms if args.request_ms is not None else first
    # Between two requests the engine is free after the first one's own work (its first decode, then
    # its answer until the next keystroke); the oracle packs each free span between two events (a
    # jump changes the plan: no batch spans it) with the best batches.
    edges = [0.0] + [f.t for f in fired] + [fired[-1].t + 60.0]
    busy = [0.0] + [request_ms + min(args.answer_tokens * first, max(0.0, (f.next_key_t - f.t) * 1e3 - request_ms))
                    for f in fired]
    free = [(a + cost / 1e3, b) for (a, b), cost in zip(zip(edges, edges[1:]), busy)]

    def rate(t0: float, t1: float, at: int) -> float:
        """Tokens prefilled from t0 to t1, the plan's first ``at`` tokens held (see above)."""
        n = 0
        for a, b in free:
            if min(b, t1) > max(a, t0):
                n += tokens((min(b, t1) - max(a, t0)) * 1e3, at + n)
        return n

    best = max(b / ms(b, c) for c in tables for b in tables[c]) * 1e3
    answers = f", answers of up to {args.answer_tokens} tokens" if args.answer_tokens else ""
    where = f" at {len(tables)} context sizes" if len(tables) > 1 else ""
    print(f"{args.trace} trace, {len(fired)} requests, batches packed between requests{where} ({request_ms:.1f} ms "
          f"each{answers}, best batch {best:.0f} tokens/s): the oracle's mean context share is {bound(rate):.0%}")
