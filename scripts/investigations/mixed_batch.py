"""Would a generated token ride along a prefill batch for free? One ``llama_decode`` of a slot's
next token beside another slot's prefill chunk, against the two decoded apart: their times, and
whether the generated slot's logits change (issue 40's tick: llama.cpp server batches all slots in
one decode; efim keeps one sequence per decode).

Two sequences in one context (slot 0: 1,500 tokens, slot 1: 1,000), 2 threads, 4 repetitions,
medians:

    PYTHONPATH=. .venv/bin/python scripts/investigations/mixed_batch.py MODEL.gguf
"""

import sys
import time
from pathlib import Path

import numpy as np

from efim_local.config import ContextParams
from efim_local.llama import Batch, Context, Model

model = Model(sys.argv[1])
ctx = Context(model, ContextParams(n_ctx_seq=4096, n_slots=2, n_threads=2, n_threads_batch=2))
batch = Batch(512, 2)
toks = np.asarray(model.tokenize(Path(__file__).with_name("context_bound.py").read_text() * 4), np.int32)
A, B = toks[:1500], toks[2000:3600]


def decode(parts, logits_for=None):
    """Decode ``(seq, tokens, start position)`` parts in one batch: ms, and ``logits_for``'s last logits."""
    batch.clear()
    row = None
    for seq, tk, pos in parts:
        for i, t in enumerate(tk):
            last = i == len(tk) - 1 and seq == logits_for
            r = batch.add(int(t), pos + i, seq, last)
            row = r if last else row
    t0 = time.perf_counter()
    ctx.decode(batch)
    return (time.perf_counter() - t0) * 1e3, (ctx.logits(row) if row is not None else None)


for seq, x in ((0, A[:-1]), (1, B[:1000])):
    for i in range(0, len(x), 256):
        decode([(seq, x[i:i + 256], i)])
print("| prefill chunk | next token alone | chunk alone | both in one decode | logits of the token |")
print("|---|---|---|---|---|")
for n in (8, 16, 32, 64):
    times: dict[str, list[float]] = {"one": [], "chunk": [], "both": []}
    diff = 0.0
    for _ in range(4):
        ctx.seq_rm(0, len(A) - 1, -1)
        ctx.seq_rm(1, 1000, -1)
        ms, alone = decode([(0, A[-1:], len(A) - 1)], 0)
        times["one"].append(ms)
        times["chunk"].append(decode([(1, B[1000:1000 + n], 1000)])[0])
        ctx.seq_rm(0, len(A) - 1, -1)
        ctx.seq_rm(1, 1000, -1)
        ms, mixed = decode([(0, A[-1:], len(A) - 1), (1, B[1000:1000 + n], 1000)], 0)
        times["both"].append(ms)
        diff = max(diff, float(np.abs(alone - mixed).max()))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"| {n} tokens | {med['one']:.0f} ms | {med['chunk']:.0f} ms | {med['both']:.0f} ms "
          f"(apart: {med['one'] + med['chunk']:.0f}) | max difference {diff:.3g} |")
