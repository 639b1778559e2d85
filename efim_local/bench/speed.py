"""The speed to expect per model size and thread count (`efim bench speed`): the shape models (random
weights, real timings: efim_local/training/shape_models.py), each run in-process with a fixed thread
count.

For each model and thread count: a cold prompt (every token prefilled: a file's first request), then
a keystroke after it (one character typed: the KV is reused, a few tokens evaluated), each
generating ``tokens`` tokens. The table is markdown (docs/benchmarks.md has the one measured here).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

COLUMNS = ("model", "threads", "cold_evaluated", "prefill_tok_s", "gen_tok_s", "cold_first_ms", "warm_evaluated",
           "warm_first_ms", "warm_total_ms")


@dataclass
class SpeedConfig:
    models: Path = Path("models")  # where make_shape_models.py wrote them
    threads: tuple[int, ...] = (1, 2)
    chars: int = 2400  # prompt size in characters (~600 tokens of Python)
    tokens: int = 16


def run(cfg: SpeedConfig, log=print) -> dict:
    from ..config import Config, ContextParams
    from ..engine import CompletionRequest, Engine
    from ..training import shape_models as sm
    from ..training.corpus import read_texts, stdlib_files

    text = next(t for t in read_texts(stdlib_files(600_000)) if len(t) > cfg.chars)[:cfg.chars]
    cut = text.rindex("\n", 0, len(text) // 2) + 1  # the cursor: a line start in the middle
    say = (lambda s: None) if log is None else tqdm.write
    todo, rows, skipped = [], [], []
    for name in sorted(sm.SHAPES, key=lambda n: sm.n_params(sm.SHAPES[n])):
        path = cfg.models / f"{name}-random-q8_0.gguf"
        if not path.exists():
            skipped.append(name)
            say(f"skipped {name}: {path} missing (scripts/make_shape_models.py)")
            continue
        todo += [(name, path, n) for n in cfg.threads]
    for name, path, n in tqdm(todo, desc="speed", disable=log is None):
        ecfg = Config(context=ContextParams(n_ctx_seq=4096, n_slots=1, n_threads=n, n_threads_batch=n),
                      store=False, max_prompt_ms=0.0, grow_share=0.0, heal=False)
        with Engine(ecfg, path) as e:
            req = dict(path="speed.py", max_tokens=cfg.tokens, ignore_eog=True)
            cold = e.complete(CompletionRequest(text, cut, **req))
            typed = text[:cut] + "x" + text[cut:]
            warm = e.complete(CompletionRequest(typed, cut + 1, **req))
        gen = (cold.tokens.generated - 1) / (cold.timings.predict_ms / 1e3)  # the first came with the prompt
        rows.append(dict(zip(COLUMNS, (name.removeprefix("qwen2.5-coder-"), n, cold.tokens.evaluated,
                                       cold.tokens.evaluated / (cold.timings.prompt_ms / 1e3), gen,
                                       cold.timings.prompt_ms, warm.tokens.evaluated, warm.timings.prompt_ms,
                                       warm.timings.total_ms))))
        say(str(tuple(rows[-1].values())))
    res = {"machine": platform.processor() or platform.machine(), "tokens": cfg.tokens, "rows": rows,
           "skipped": skipped}
    if log is not None:
        log(table(res))
    return res


def table(res: dict) -> str:
    lines = [f"\n{res['machine']}, {res['tokens']} tokens generated per request\n",
             "| model | threads | cold prompt: tokens, prefill tok/s | generation tok/s | cold first token ms "
             "| keystroke: tokens evaluated, first token ms, all 16 ms |",
             "|---|---:|---|---:|---:|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['model']} | {r['threads']} | {r['cold_evaluated']}, {r['prefill_tok_s']:.0f} "
                     f"| {r['gen_tok_s']:.1f} | {r['cold_first_ms']:.0f} "
                     f"| {r['warm_evaluated']}, {r['warm_first_ms']:.0f}, {r['warm_total_ms']:.0f} |")
    return "\n".join(lines)
