"""The speed to expect per model size and thread count: the shape models (random weights, real
timings: efim_local/training/shape_models.py), each run in-process with a fixed thread count.

For each model and thread count: a cold prompt (every token prefilled: a file's first request),
then a keystroke after it (one character typed: the KV is reused, a few tokens evaluated), each
generating 16 tokens. Prints a markdown table (docs/benchmarks.md has the one measured here).

    .venv/bin/python scripts/make_shape_models.py --out models
    .venv/bin/python scripts/speed_table.py --models models --threads 1 2
"""

import argparse
import platform
from pathlib import Path

from efim_local.config import Config, ContextParams
from efim_local.engine import CompletionRequest, Engine
from efim_local.training import shape_models as sm
from efim_local.training.corpus import read_texts, stdlib_files

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--models", type=Path, default=Path("models"))
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
ap.add_argument("--chars", type=int, default=2400, help="prompt size in characters (~600 tokens of Python)")
ap.add_argument("--tokens", type=int, default=16)
args = ap.parse_args()

text = next(t for t in read_texts(stdlib_files(600_000)) if len(t) > args.chars)[:args.chars]
cut = text.rindex("\n", 0, len(text) // 2) + 1  # the cursor: a line start in the middle
rows = []
for name in sorted(sm.SHAPES, key=lambda n: sm.n_params(sm.SHAPES[n])):
    path = args.models / f"{name}-random-q8_0.gguf"
    if not path.exists():
        print(f"skipped {name}: {path} missing (scripts/make_shape_models.py)")
        continue
    for n in args.threads:
        cfg = Config(context=ContextParams(n_ctx_seq=4096, n_slots=1, n_threads=n, n_threads_batch=n),
                     store=False, max_prompt_ms=0.0, grow_share=0.0, heal=False)
        with Engine(cfg, path) as e:
            req = dict(path="speed.py", max_tokens=args.tokens, ignore_eog=True)
            cold = e.complete(CompletionRequest(text, cut, **req))
            typed = text[:cut] + "x" + text[cut:]
            warm = e.complete(CompletionRequest(typed, cut + 1, **req))
        gen = (cold.tokens.generated - 1) / (cold.timings.predict_ms / 1e3)  # the first came with the prompt
        rows.append((name.removeprefix("qwen2.5-coder-"), n, cold.tokens.evaluated,
                     cold.tokens.evaluated / (cold.timings.prompt_ms / 1e3), gen, cold.timings.prompt_ms,
                     warm.tokens.evaluated, warm.timings.prompt_ms, warm.timings.total_ms))
        print(rows[-1], flush=True)
print(f"\n{platform.processor() or platform.machine()}, {args.tokens} tokens generated per request\n")
print("| model | threads | cold prompt: tokens, prefill tok/s | generation tok/s | cold first token ms "
      "| keystroke: tokens evaluated, first token ms, all 16 ms |")
print("|---|---:|---|---:|---:|---|")
for m, n, ce, pf, g, cf, we, wf, wt in rows:
    print(f"| {m} | {n} | {ce}, {pf:.0f} | {g:.1f} | {cf:.0f} | {we}, {wf:.0f}, {wt:.0f} |")
