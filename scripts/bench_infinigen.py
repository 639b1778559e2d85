"""InfiniGen-style sparse restore vs full restore of long saved states.

One long input (standard-library modules concatenated) is prefilled once; its state, truncated
at several lengths of about --tokens, stands for a saved file. Each sample restores it and
decodes the next --tail tokens, then greedily completes a line. At each budget every policy
restores only part of the state (see efim_local/kv/sparse/select.py) and is compared with the
full restore: bytes restored, restore time, next-token top-1 agreement, first-line agreement.

    python scripts/calibrate_infinigen.py --model gemma        # once per model
    python scripts/bench_infinigen.py --model gemma            # gemma3-270m, 8k tokens
    python scripts/bench_infinigen.py --model default --samples 8
"""

import argparse
import time

import numpy as np
from tqdm import tqdm

from efim_local.bench import util as bu
from efim_local.llama import Batch, Context, ContextParams, Model
from efim_local.kv.sparse import skew as skew_mod
from efim_local.kv.sparse.capture import QKCapture
from efim_local.kv.sparse.restore import SparseRestorer
from efim_local.kv.sparse.select import POLICIES, SelectConfig, keys_of, partial_keys
from efim_local.kv import kvblob
from efim_local.kv.fingerprint import model_fingerprint
from efim_local.training import corpus
from efim_local.training.corpus import stdlib_files

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="gemma", help="'gemma', 'default' or a GGUF path")
ap.add_argument("--tokens", type=int, default=8192, help="state length (the longest sample)")
ap.add_argument("--samples", type=int, default=12)
ap.add_argument("--tail", type=int, default=32, help="unseen tokens decoded after the restore")
ap.add_argument("--line-tokens", type=int, default=48, help="greedy tokens for the first line")
ap.add_argument("--budgets", default="0.1,0.2,0.4")
ap.add_argument("--alpha", type=float, default=4.0)
ap.add_argument("--queries", type=int, default=SelectConfig.queries, help="tail tokens rehearsed")
ap.add_argument("--threads", type=int, default=0)
args = ap.parse_args()

model_path, _ = bu.bench_model(args.model)
fp = model_fingerprint(model_path).hex()
side = skew_mod.sidecar_path(skew_mod.default_dir(), fp)
if not side.exists():
    print("calibrating (no sidecar yet) ...")
    skew_mod.calibrate(model_path, corpus.calibration_text(), fp).save(side)
skew = skew_mod.Skew.load(side, fp)

cap = QKCapture()
n_ctx = args.tokens + args.tail + args.line_tokens + 64
params = ContextParams(n_ctx_seq=n_ctx, n_slots=1, n_batch=512, n_threads=args.threads)
corpus = "".join(p.read_text("utf-8", errors="replace") for p in stdlib_files(3_000_000))
with Model(model_path) as model, Context(model, params, cap.callback) as ctx, Batch(512) as batch:
    toks = model.tokenize(corpus)[:args.tokens + args.tail]
    if len(toks) < args.tokens + args.tail:
        raise SystemExit("corpus too short")
    restorer = SparseRestorer(ctx, batch, cap, skew, n_stream=1, n_swa=model.n_swa)

    def decode(tokens, pos0, want_logits=True):
        for s in range(0, len(tokens), batch.capacity if hasattr(batch, "capacity") else 512):
            part = tokens[s:s + 512]
            batch.clear()
            for i, t in enumerate(part):
                batch.add(int(t), pos0 + s + i, 0, logits=want_logits and s + i == len(tokens) - 1)
            ctx.decode(batch)
        return ctx.logits(len(tokens) - 1 - (len(tokens) - 1) // 512 * 512) if want_logits else None

    def answer(tail, pos0):
        """Top-1 after the tail, and the greedy first line."""
        logits = decode(tail, pos0)
        top1 = int(np.argmax(logits))
        out, t, pos = b"", top1, pos0 + len(tail)
        for _ in range(args.line_tokens):
            if model.is_eog(t):
                break
            out += model.piece(t)
            if b"\n" in out:
                break
            batch.clear()
            batch.add(t, pos, 0, logits=True)
            ctx.decode(batch)
            pos += 1
            t = int(np.argmax(ctx.logits(0)))
        return top1, out.split(b"\n")[0]

    print(f"prefilling {args.tokens} tokens of {model_path.name} ...")
    t0 = time.perf_counter()
    decode(toks[:args.tokens], 0, want_logits=False)
    prefill_s = time.perf_counter() - t0
    full_state = kvblob.normalize(ctx.seq_state(0))
    ctx.seq_rm(0, 0, -1)

    lengths = [args.tokens - i * 61 for i in range(args.samples)]
    budgets = [float(b) for b in args.budgets.split(",")]
    runs = [(b, p) for b in budgets for p in POLICIES]
    stats = {r: {k: [] for k in ("bytes", "ms", "rehearsal_ms", "select_ms", "top1", "line", "kept")} for r in runs}
    full_ms = []
    for i, n in enumerate(tqdm(lengths, desc="samples")):
        state = kvblob.truncate(full_state, n)
        blob = kvblob.parse_normalized(state)
        tail = toks[n:n + args.tail]
        t0 = time.perf_counter()
        full_bytes = restorer.load(0, blob, np.ones(blob.sections[0].cell_count, bool))
        full_ms.append((time.perf_counter() - t0) * 1e3)
        ref = answer(tail, n)
        ctx.seq_rm(0, 0, -1)
        # Partial keys are saved beside a state when it is saved, so they are not timed here.
        keys = keys_of(blob, skew)
        pkeys = {"infinigen": partial_keys(keys, skew.proj), "noskew": partial_keys(keys, skew.proj_noskew)}
        for b, p in runs[i % len(runs):] + runs[:i % len(runs)]:  # no policy always goes first
            cfg = SelectConfig(budget=b, alpha=args.alpha, queries=args.queries, policy=p)
            res = restorer.restore(0, state, tail, cfg, pkeys.get(p))
            got = answer(tail, n)
            ctx.seq_rm(0, 0, -1)
            s = stats[(b, p)]
            s["bytes"].append(res.bytes_restored / full_bytes)
            s["ms"].append(res.restore_ms)
            s["rehearsal_ms"].append(res.rehearsal_ms)
            s["select_ms"].append(res.select_ms)
            s["kept"].append(res.kept / res.cells)
            s["top1"].append(got[0] == ref[0])
            s["line"].append(got[1] == ref[1])

rows = [{"budget": f"{int(b * 100)}%", "policy": p,
         "kept_%": 100 * bu.mean(stats[(b, p)]["kept"]),
         "bytes_%": 100 * bu.mean(stats[(b, p)]["bytes"]),
         "restore_ms": bu.mean(stats[(b, p)]["ms"]),
         "rehearsal_ms": bu.mean(stats[(b, p)]["rehearsal_ms"]),
         "select_ms": bu.mean(stats[(b, p)]["select_ms"]),
         "top1_agree_%": 100 * bu.mean(stats[(b, p)]["top1"]),
         "line_agree_%": 100 * bu.mean(stats[(b, p)]["line"])} for b, p in runs]
print(f"\n{model_path.name}: {args.samples} samples of ~{args.tokens} tokens, tail {args.tail}; "
      f"full restore {bu.mean(full_ms):.1f} ms (prefill was {prefill_s:.1f} s)")
print(bu.table(rows, list(rows[0])))
path = bu.save(f"infinigen-{'gemma3-270m' if args.model == 'gemma' else args.model}",
               {"model": str(model_path), "args": vars(args), "full_restore_ms": bu.mean(full_ms),
                "prefill_s": prefill_s, "rows": rows})
print(f"saved {path}")
