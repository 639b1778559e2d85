"""HumanEval infilling: exact match and pass@1 for FIM and EFIM layouts.

For each task the hole is generated greedily (up to 128 tokens).

- ``--protocol typed`` (default): the user has typed the hole's first j
  characters (j random, so usually mid-word). FIM puts them at the end of the
  prefix; EFIM after the middle marker. Both must continue a partial word,
  which is where fragment training and token healing matter.
- ``--protocol paper``: the EFIM paper's sub-token test. FIM sends the whole
  prompt as the prefix (tokenized in one piece); EFIM splits the prompt at a
  random character and sends the tail after the middle marker.

``--heal`` adds rows with token healing.
Generated code runs in a separate process with a timeout and memory limit,
never in this one.

    python scripts/eval_infill.py --model out/train/model.gguf --limit 200
"""

import argparse
import gzip
import json
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from efim_local.bench import util as bu
from efim_local.llama import ContextParams
from efim_local.config import Config
from efim_local.engine.engine import CompletionRequest, Engine
from efim_local.prompt.planner import Anchor

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "human-eval-infilling"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--set", default="SingleLine", choices=["SingleLine", "MultiLine", "RandomSpan", "RandomSpanLight"])
ap.add_argument("--limit", type=int, default=0, help="first N tasks (0: all)")
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--protocol", default="typed", choices=["typed", "paper"])
ap.add_argument("--heal", action="store_true", help="also run both layouts with token healing")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--name", default=None, help="results name (default: from the model)")
args = ap.parse_args()

name = {"SingleLine": "SingleLineInfilling", "MultiLine": "MultiLineInfilling",
        "RandomSpan": "RandomSpanInfilling", "RandomSpanLight": "RandomSpanInfillingLight"}[args.set]
with gzip.open(DATA / f"HumanEval-{name}.jsonl.gz", "rt") as f:
    tasks = [json.loads(line) for line in f]
if args.limit:
    tasks = tasks[:args.limit]

model, template = bu.bench_model(args.model)
cfg = Config(model=str(model), fim_template=template, max_tokens=args.max_tokens,
             context=ContextParams(n_ctx_seq=2048, n_slots=1))


def limits():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))


def passes(task, middle: str) -> bool:
    program = task["prompt"] + middle + task["suffix"] + "\n" + task["test"] + f"\ncheck({task['entry_point']})\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(program)
    try:
        r = subprocess.run([sys.executable, "-I", f.name], capture_output=True, timeout=15, preexec_fn=limits,
                           cwd=tempfile.gettempdir())
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        Path(f.name).unlink(missing_ok=True)


def cut_to_hole(text: str) -> str:
    """Single-line holes end at the line's end (newline included); others are taken as generated."""
    if args.set == "SingleLine":
        return text.split("\n", 1)[0] + "\n"
    return text


rng = random.Random(args.seed)
rows = {"fim": [], "efim": []} | ({"fim+heal": [], "efim+heal": []} if args.heal else {})
with Engine(cfg, model) as e:
    tok = e.model.tokenize
    for task in tqdm(tasks, desc=args.set):
        prompt, suffix, want = task["prompt"], task["suffix"], task["canonical_solution"]
        if args.protocol == "typed":
            j = rng.randint(0, max(0, len(want.rstrip("\n")) - 1))  # typed so far
            head, typed = prompt, want[:j]
        else:
            k = rng.randint(0, len(prompt))  # the sub-token split
            head, typed = prompt[:k], prompt[k:]
        doc = head + typed + suffix
        for layout in rows:
            lay, heal = layout.split("+")[0], layout.endswith("+heal")
            # The planner's own path, anchored at the start of the typed text. The paper's FIM
            # baseline sends the whole prompt as the prefix, tokenized in one piece.
            a = len(prompt) if args.protocol == "paper" and lay == "fim" else len(head)
            anchor = Anchor(a, doc[:a], tuple(tok(doc[:a])), suffix, tuple(tok(suffix)))
            session = e.session(task["task_id"])
            session.anchor, session.layout = anchor, lay
            req = CompletionRequest(doc, len(head) + len(typed), path=task["task_id"], layout=lay,
                                    max_tokens=args.max_tokens, heal=heal, stop_at_newline=args.set == "SingleLine")
            middle = cut_to_hole(e.complete(req).text)
            hole = (typed + middle) if args.protocol == "typed" else middle
            rows[layout].append({"task": task["task_id"], "exact": hole.strip() == want.strip(),
                                 "pass": passes(task, hole) if args.protocol == "typed" else passes(task, middle),
                                 "typed_chars": len(typed), "generated": middle[:200]})

summary = []
for layout, rs in rows.items():
    n = len(rs)
    summary.append({"layout": layout, "tasks": n, "exact_match_%": 100 * sum(r["exact"] for r in rs) / max(1, n),
                    "pass@1_%": 100 * sum(r["pass"] for r in rs) / max(1, n)})
print(bu.table(summary, list(summary[0])))
label = args.name or Path(str(model)).stem
print("saved", bu.save(f"infill-{label}-{args.set}", {"args": vars(args), "summary": summary, "rows": rows}))
