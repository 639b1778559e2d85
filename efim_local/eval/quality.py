"""Answer quality: HumanEval infilling through the engine's own planner, per layout and healing.

For each task the hole is completed greedily, in-process (no latency budget: the whole plan), by
each of the layouts ``fim``, ``fim+heal``, ``efim``, ``efim+heal`` and the engine's ``default``
(its own layout and healing for the model; a default that equals one of the others is not run
twice). Two protocols:

- ``typed`` (what a user sees): the user has typed the hole's first j characters (j random), the
  cursor after them. The plan anchors at the cursor's line start, as the daemon's does: FIM puts
  the line typed so far at the end of the prefix (llama.vim's ``/infill`` request), EFIM after the
  middle marker.
- ``paper`` (the EFIM paper's sub-token test): FIM sends the whole text before the hole as the
  prefix, tokenized in one piece; EFIM splits it at a random character and sends the tail after
  the middle marker.

Scores: exact match (the hole, stripped) and pass@1 (the task's tests, run in a subprocess with
CPU, memory and time limits: generated code never runs in this process), each with the paired 95%
bootstrap interval of (better of fim and fim+heal) minus the default, overall and by what the user
typed last (nothing, whitespace, punctuation, a word character). Also per layout: the share of
answers that ran to ``max_tokens`` and answers holding a special token's text.
"""

from __future__ import annotations

import gzip
import json
import random
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .results import RESULTS, save, table

SETS = {"single": "SingleLineInfilling", "multi": "MultiLineInfilling", "span-light": "RandomSpanInfillingLight",
        "span": "RandomSpanInfilling"}
LAYOUTS = ("fim", "fim+heal", "efim", "efim+heal", "default")
CLASSES = ("nothing", "whitespace", "punctuation", "word")
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "human-eval-infilling"
BOOT = 2000  # bootstrap resamples
SAVE_EVERY = 25  # tasks between saves of the rows so far (a long run stopped early keeps them)
SPECIAL = ("<|", "|>", "<fim_", "<PRE>", "<SUF>", "<MID>", "<EOT>")  # marker text that never belongs in a hole


@dataclass
class QualityConfig:
    model: Path
    template: str | None = None
    set: str = "single"
    protocol: str = "typed"
    tasks: int = 0  # the first N tasks (0: all)
    max_tokens: int = 0  # 0: 32 single-line, 128 otherwise
    seed: int = 0
    data: Path = DATA
    threads: int = 0
    out: Path = RESULTS


def load_tasks(name: str, limit: int = 0, data: Path = DATA) -> list[dict]:
    """The tasks of one HumanEval-infilling set (``SETS``), the first ``limit`` (0: all)."""
    path = data / f"HumanEval-{SETS[name]}.jsonl.gz"
    if not path.is_file():
        raise SystemExit(f"no HumanEval-infilling data at {path} (shared/data/human-eval-infilling)")
    with gzip.open(path, "rt") as f:
        tasks = [json.loads(line) for line in f]
    return tasks[:limit] if limit else tasks


def typed_class(before: str) -> str:
    """What the user typed last, from the text before the cursor: nothing on the cursor's line yet,
    whitespace, punctuation or a word character."""
    if not before or before[-1] == "\n":
        return "nothing"
    c = before[-1]
    return "whitespace" if c.isspace() else "word" if c.isalnum() or c == "_" else "punctuation"


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))


def passes(task: dict, hole: str) -> bool:
    """Whether the program with ``hole`` filled in passes the task's tests (in a subprocess)."""
    program = task["prompt"] + hole + task["suffix"] + "\n" + task["test"] + f"\ncheck({task['entry_point']})\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(program)
    try:
        r = subprocess.run([sys.executable, "-I", f.name], capture_output=True, timeout=15, preexec_fn=_limits,
                           cwd=tempfile.gettempdir())
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        Path(f.name).unlink(missing_ok=True)


def paired(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` in points, with its 95% paired bootstrap interval."""
    d = (np.asarray(a, float) - np.asarray(b, float)) * 100
    if not len(d):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(BOOT, len(d)))].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _layouts(engine) -> dict[str, tuple[str | None, bool | None]]:
    """The (layout, heal) each row runs; the default row is left out when it equals another."""
    rows = {"fim": ("fim", False), "fim+heal": ("fim", True), "efim": ("efim", False), "efim+heal": ("efim", True)}
    same = next((k for k, v in rows.items() if v == (engine.default_layout, engine.default_heal)), None)
    return rows | ({} if same else {"default": (None, None)}), same


def run(cfg: QualityConfig, log=print) -> dict:
    """Run the quality benchmark; returns the summary (and saves JSON with every answer)."""
    from tqdm import tqdm

    from ..config import Config
    from ..engine.engine import Engine
    from ..llama import ContextParams
    from ..prompt.planner import Anchor
    from ..request import CompletionRequest

    tasks = load_tasks(cfg.set, cfg.tasks, cfg.data)
    single = cfg.set == "single"
    max_tokens = cfg.max_tokens or (32 if single else 128)
    conf = Config(model=str(cfg.model), fim_template=cfg.template, max_tokens=max_tokens, max_prompt_ms=0,
                  context=ContextParams(n_ctx_seq=4096, n_slots=2, n_threads=cfg.threads, n_threads_batch=cfg.threads))
    rng = random.Random(cfg.seed)
    rows: dict[str, list[dict]] = {}
    pass_cache: dict[tuple[str, str], bool] = {}
    with Engine(conf, cfg.model) as e:
        runs, default_is = _layouts(e)
        rows = {k: [] for k in runs}
        tok = e.model.tokenize
        label = Path(str(cfg.model)).stem
        saved_as = f"quality-{label}-{cfg.set}-{cfg.protocol}"
        for n, task in enumerate(tqdm(tasks, desc=f"quality {cfg.set} ({cfg.protocol})", disable=log is None)):
            if n and n % SAVE_EVERY == 0:
                save(saved_as, {"config": {k: str(v) for k, v in vars(cfg).items()}, "partial": n, "rows": rows},
                     cfg.out)
            prompt, suffix, want = task["prompt"], task["suffix"], task["canonical_solution"]
            if cfg.protocol == "typed":
                j = rng.randint(0, max(0, len(want.rstrip("\n")) - 1))
                head, typed = prompt, want[:j]
            else:
                k = rng.randint(0, len(prompt))
                head, typed = prompt[:k], prompt[k:]
            doc, cursor = head + typed + suffix, len(head) + len(typed)
            path = task["task_id"]
            for name, (layout, heal) in runs.items():
                e.forget(path)
                if cfg.protocol == "paper":  # the anchor at the split (FIM: the whole prompt, one piece)
                    a = len(prompt) if layout == "fim" else len(head)
                    session = e.session(path)
                    session.anchor = Anchor(a, doc[:a], tuple(tok(doc[:a])), suffix, tuple(tok(suffix)))
                    session.layout = layout or e.default_layout
                req = CompletionRequest(doc, cursor, path=path, layout=layout, heal=heal, max_tokens=max_tokens,
                                        max_prompt_ms=0, stop_at_newline=single)
                out = e.complete(req)
                text = out.text.split("\n", 1)[0] + "\n" if single else out.text
                hole = typed + text if cfg.protocol == "typed" else text
                key = (path, hole)
                if key not in pass_cache:
                    pass_cache[key] = passes(task, hole)
                rows[name].append({"task": path, "class": typed_class(doc[:cursor]), "typed": typed[-40:],
                                   "exact": hole.strip() == want.strip(), "pass": pass_cache[key],
                                   "reason": out.stop_reason, "generated": out.tokens.generated,
                                   "special": any(s in out.text for s in SPECIAL), "answer": out.text[:300]})
        status = {"model": str(cfg.model), "default_layout": e.default_layout, "default_heal": e.default_heal,
                  "layout_reason": e.layout_reason}
    if default_is:
        rows["default"] = rows[default_is]
    summary = summarize(rows, cfg.seed)
    summary.update(status, default_is=default_is, set=cfg.set, protocol=cfg.protocol, tasks=len(tasks),
                   max_tokens=max_tokens)
    path = save(saved_as, {"config": {k: str(v) for k, v in vars(cfg).items()}, "summary": summary, "rows": rows},
                cfg.out)
    summary["json"] = str(path)
    if log is not None:
        log(report(summary))
    return summary


def summarize(rows: dict[str, list[dict]], seed: int = 0) -> dict:
    """Per layout: exact, pass@1, stops; per class; and the paired differences against the default."""
    layouts = []
    for name, rs in rows.items():
        n = max(1, len(rs))
        layouts.append({"layout": name, "tasks": len(rs), "exact_%": 100 * sum(r["exact"] for r in rs) / n,
                        "pass@1_%": 100 * sum(r["pass"] for r in rs) / n,
                        "max_tokens_%": 100 * sum(r["reason"] in ("max_tokens", "context_full") for r in rs) / n,
                        "eog_%": 100 * sum(r["reason"] == "eog" for r in rs) / n,
                        "special": sum(r["special"] for r in rs)})
    groups = [("all", None)] + [(c, c) for c in CLASSES]
    by_class, diffs = [], []
    for label, cls in groups:
        pick = {name: [r for r in rs if cls is None or r["class"] == cls] for name, rs in rows.items()}
        n = len(pick["default"])
        if not n:
            continue
        by_class.append({"typed last": label, "tasks": n,
                         **{f"{name} exact": 100 * sum(r["exact"] for r in rs) / n for name, rs in pick.items()}})
        for metric in ("exact", "pass"):
            vals = {name: np.array([r[metric] for r in rs], float) for name, rs in pick.items()}
            best = max(("fim", "fim+heal"), key=lambda k: vals[k].mean())
            mean, lo, hi = paired(vals[best], vals["default"], seed)
            diffs.append({"typed last": label, "tasks": n, "metric": metric, "fim side": best,
                          "better - default": mean, "95% low": lo, "95% high": hi})
    return {"layouts": layouts, "by_class": by_class, "paired": diffs}


def report(s: dict) -> str:
    """The summary as tables."""
    head = (f"HumanEval {s['set']} ({s['protocol']} protocol), {s['tasks']} tasks, {s['model']}: default = "
            f"{s['default_layout']}{'+heal' if s['default_heal'] else ''}")
    cls_cols = list(s["by_class"][0]) if s["by_class"] else []
    return "\n\n".join([head, table(s["layouts"], list(s["layouts"][0])), table(s["by_class"], cls_cols),
                        table(s["paired"], list(s["paired"][0]))])
