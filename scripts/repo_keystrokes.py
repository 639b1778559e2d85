"""Keystroke cost of repository context (issue 25): the same typing with ``repo_context`` on and off.

For each of --files Python files of a git work tree (a mirror's export, see eval_repo.py, or any
checkout), one line in the file's middle is removed and typed again, one character per request, in two
in-process engines on the same model: file-only, and with repository context. After the first request
each engine does what the daemon does in idle time (the file-only one grows its plan back, the other
also switches to its repository context), then the keystrokes run back to back. Files alternate which
engine goes first, so the machine's load falls on both alike. Reported per engine: prompt time p50/p95
over the keystrokes, evaluated tokens, and how many keystrokes re-prefilled any token of the lead
(cached tokens fewer than BOS + lead: must be 0).

    nice -n 19 python scripts/repo_keystrokes.py --root /tmp/efim-eval-repo/httpx-ae1b9f66238f --files 12
"""

import argparse
import random
import subprocess
from pathlib import Path

import numpy as np

from efim_local.bench import util as bu
from efim_local.config import Config, ContextParams
from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.decode import drive
from efim_local.engine.repobuild import rebuild_steps

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--root", type=Path, required=True, help="a git work tree (git init is run if it has no .git)")
ap.add_argument("--files", type=int, default=12)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--max-prompt-ms", type=float, default=300.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--model", default="gemma", help="'gemma' (text FIM markers) or a GGUF with FIM tokens")
ap.add_argument("--min-bytes", type=int, default=3000)
args = ap.parse_args()

root = args.root.resolve()
if not (root / ".git").exists():
    subprocess.run(["git", "init", "-q", str(root)], check=True)
files = sorted(p for p in root.rglob("*.py") if ".git" not in p.parts and args.min_bytes < p.stat().st_size < 60000)
rng = random.Random(args.seed)
files = rng.sample(files, min(args.files, len(files)))
model = bu.gemma_path() if args.model == "gemma" else Path(args.model)
ctx = ContextParams(n_ctx_seq=4096, n_slots=4, n_threads=args.threads, n_threads_batch=args.threads)
base = dict(model=str(model), max_prompt_ms=args.max_prompt_ms, max_tokens=16, context=ctx,
            **({"fim_template": bu.GEMMA_TEMPLATE} if args.model == "gemma" else {}))
engines = {"file": Engine(Config(**base), model), "repo": Engine(Config(**base, repo_context=True), model)}
rows = {name: [] for name in engines}


def type_line(name: str, e: Engine, path: Path, text: str, start: int, line: str) -> None:
    doc = text[:start] + text[start + len(line):]
    first = e.complete(CompletionRequest(doc, start, path=str(path)))
    if name == "repo":
        drive(rebuild_steps(e, str(path)))
    e.grow(str(path))
    lead = len(e.planner.markers.bos) + len(e.session(str(path)).lead)
    for k in range(1, len(line) + 1):
        d = doc[:start] + line[:k] + doc[start:]
        out = e.complete(CompletionRequest(d, start + k, path=str(path)))
        rows[name].append({"prompt_ms": out.timings.prompt_ms, "evaluated": out.tokens.evaluated,
                           "source": out.source, "reprefill": out.source == "computed" and out.tokens.cached < lead,
                           "lead": lead, "reanchor": out.reanchor})
    print(f"{name:5s} {path.relative_to(root)}: first {first.reanchor} {first.timings.prompt_ms:.0f} ms, "
          f"lead {lead} tokens, {len(line)} keystrokes", flush=True)


for i, path in enumerate(files):
    text = path.read_text("utf-8", errors="replace")
    lines = text.split("\n")
    mid = [j for j in range(len(lines) // 3, 2 * len(lines) // 3) if 10 <= len(lines[j].strip()) <= 60]
    if not mid:
        continue
    j = rng.choice(mid)
    start = sum(len(x) + 1 for x in lines[:j])
    order = ["file", "repo"] if i % 2 == 0 else ["repo", "file"]
    for name in order:
        type_line(name, engines[name], path, text, start, lines[j])

summary = []
for name, rs in rows.items():
    ms = np.array([r["prompt_ms"] for r in rs])
    comp = np.array([r["prompt_ms"] for r in rs if r["source"] == "computed"])
    summary.append({"context": name, "keystrokes": len(rs), "computed": len(comp),
                    "p50 ms": np.percentile(ms, 50), "p95 ms": np.percentile(ms, 95),
                    "computed p95 ms": np.percentile(comp, 95) if len(comp) else 0.0,
                    "mean evaluated": np.mean([r["evaluated"] for r in rs]),
                    "mean lead": np.mean([r["lead"] for r in rs]),
                    "lead re-prefilled": sum(r["reprefill"] for r in rs),
                    "repo_context": sum(r["reanchor"] == "repo_context" for r in rs)})
print(bu.table(summary, list(summary[0])))
print("saved", bu.save("repo-keystrokes", {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary}))
for e in engines.values():
    e.close()
