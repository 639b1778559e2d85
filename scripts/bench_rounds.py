"""EFIM paper's multi-round benchmark: EFIM vs FIM (both with prefix reuse).

For each source file of 2-4k tokens, with H = len(file)//2 and c = H//7:
prefix = file[:c], suffix = file[H:], and in round r (0..4) the text typed
so far is file[c : H/7*(r+2)]. Every round asks for 128 tokens (EOS ignored,
temperature 0.2, top-p 0.95, top-k 20). Files take turns, one slot each, as
concurrent users would.

    python scripts/bench_rounds.py                 # gemma3-270m (pip install -e '.[bench]')
    python scripts/bench_rounds.py --model tiny    # the project's tiny model
"""

import argparse
from tqdm import tqdm

from efim_local import benchutil as bu
from efim_local.backend import ContextParams
from efim_local.config import Config
from efim_local.engine import CompletionRequest, Engine

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="gemma", help="'gemma', 'default', or a GGUF path")
ap.add_argument("--files", type=int, default=4)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=0)
args = ap.parse_args()

model_path, template = bu.bench_model(args.model)

# The middle grows by a whole chunk per round, so let it grow without re-anchoring.
cfg = Config(model=str(model_path), fim_template=template, max_tokens=args.max_tokens, max_middle_tokens=8192,
             context=ContextParams(n_ctx_seq=4608, n_slots=args.files, n_batch=512, n_threads=args.threads))

results = {}
for layout in ("efim", "fim"):
    with Engine(cfg, model_path) as engine:
        if not results:
            files = bu.pick_sources(engine.model.tokenize, args.files, 2000, 4000)
        rows = []
        steps = [(r, f) for r in range(args.rounds) for f in range(len(files))]
        for r, f in tqdm(steps, desc=layout):
            name, text = files[f]
            H = len(text) // 2
            c = H // 7
            end = int(H / 7 * (r + 2))
            doc = text[:end] + text[H:]
            req = CompletionRequest(doc, end, path=name, layout=layout, max_tokens=args.max_tokens,
                                    temperature=0.2, top_p=0.95, top_k=20, seed=r, ignore_eog=True)
            out = engine.complete(req)
            anchor = engine.sessions[name].anchor.offset
            rows.append({"middle": len(engine.model.tokenize(doc[anchor:end])),"file": name, "round": r, "ttft_ms": out.timings.prompt_ms, "total_ms": out.timings.total_ms,
                         "prompt": out.tokens.prompt, "cached": out.tokens.cached, "evaluated": out.tokens.evaluated,
                         "reanchor": out.reanchor})
        results[layout] = rows

summary = []
for layout, rows in results.items():
    later = [x for x in rows if x["round"] > 0]
    # New middle tokens in a round: how much the middle piece grew since the file's last round.
    prev = {}
    for x in rows:
        x["new_middle"] = x["middle"] - prev.get(x["file"], 0)
        prev[x["file"]] = x["middle"]
    summary.append({
        "layout": layout,
        "ttft_mean_ms": bu.mean([x["ttft_ms"] for x in rows]),
        "ttft_p95_ms": bu.pctl([x["ttft_ms"] for x in rows], 0.95),
        "ttft_mean_r1+_ms": bu.mean([x["ttft_ms"] for x in later]),
        "latency_mean_ms": bu.mean([x["total_ms"] for x in rows]),
        "cached_frac": sum(x["cached"] for x in rows) / sum(x["prompt"] for x in rows),
        "evaluated_r1+": bu.mean([x["evaluated"] for x in later]),
        "eval/new_middle_r1+": sum(x["evaluated"] for x in later) / max(1, sum(x["new_middle"] for x in later)),
    })
e, f = summary
ratio = f["ttft_mean_ms"] / e["ttft_mean_ms"]
ratio_later = f["ttft_mean_r1+_ms"] / e["ttft_mean_r1+_ms"]
print(bu.table(summary, list(summary[0])))
print(f"\nFIM/EFIM mean TTFT: {ratio:.2f}x over all rounds, {ratio_later:.2f}x over rounds after the first")
path = bu.save(f"rounds-{'gemma3-270m' if args.model == 'gemma' else 'model'}", {
    "model": str(model_path), "files": [n for n, _ in files], "args": vars(args), "summary": summary,
    "ratio_ttft_mean": ratio, "ratio_ttft_mean_later": ratio_later, "rows": results})
print(f"saved {path}")
