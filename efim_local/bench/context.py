"""What the context is worth: the text the user typed next, scored under three contexts.

A paced replay (``paced.py``) through efim records each request's plan: the prefix, middle and
suffix tokens its prompt held (the reply's ``context``). The text the user then typed (to the line
end, at most 32 characters) is scored, teacher-forced, by a real model (gemma3-270m by default)
after the context of:

- ``used``: the plan efim answered from (a latency budget may have cut it);
- ``full``: the plan without a budget: the planner's plan at that cursor (a file bigger than a
  slot is trimmed around the cursor);
- ``llama.vim``: llama.vim's window, 256 lines before the cursor's line and 64 after.

Every request efim planned is scored (``planned``: a request the next key cancelled during its
prefill has a plan too), and separately those whose ghost came before the next key (``shown``).

The texts of a plan are rebuilt from its token counts: its ``prefix + middle`` tokens nearest the
cursor, less the ``gap`` a reduced plan dropped between them and the ``head`` it kept (cached, further
up), and the first ``suffix`` tokens after it (by the replay model's tokenizer),
then tokenized by the scorer. ``form="left"`` scores after the left context only (gemma3-270m was
not trained to fill in the middle: a suffix before the cursor is noise to it); ``form="fim"``
puts both sides in the scorer's own FIM tokens (PRE left SUF right MID) for a FIM model. The result:
mean bits per character (all bits over all characters) with 95% bootstrap intervals over
requests, and the paired differences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import paced
from . import util as bu

CONDITIONS = ("used", "full", "llama.vim")
VIM_BEFORE, VIM_AFTER = 256, 64  # llama.vim's n_prefix and n_suffix (lines)


@dataclass
class ContextConfig:
    model: Path  # the model efim's daemon runs in the replay
    scorer: Path | None = None  # the scoring model; None: gemma3-270m
    trace: str | Path | None = None
    max_requests: int = 200
    n_ctx: int = 4096  # efim's slot, as the default config
    threads: int = 0  # the daemon's (0: its default, the free cores)
    scorer_threads: int = 1
    max_prompt_ms: float | None = None  # efim's latency budget; None: the config's default
    busy: bool = False  # the replay with one core kept busy by another process (not the scoring)
    max_chars: int = 32
    form: str = "left"  # "left" | "fim"
    n_boot: int = 2000
    pacing: paced.Pacing = field(default_factory=paced.Pacing)


def typed_next(trace_steps: list[paced.Step], i: int, max_chars: int = 32) -> str:
    """The characters the user types after step ``i``, to the line end, at most ``max_chars``."""
    out = []
    for s in trace_steps[i + 1:]:
        if s.kind == "key":
            ch = s.change[2][0]  # an auto-pair inserts two; the user typed the first
        elif s.kind == "over":
            ch = s.doc[s.cursor - 1]  # typed over the closer the editor had put there
        else:  # a jump, a file opened, closers cleaned up: the typing at this place ended
            break
        if ch == "\n" or len(out) == max_chars:
            break
        out.append(ch)
    return "".join(out)


def vim_window(doc: str, cursor: int) -> tuple[str, str]:
    """llama.vim's context: 256 lines before the cursor's line and the line's head; its tail and 64 lines."""
    start = doc.rfind("\n", 0, cursor) + 1
    head = start
    for _ in range(VIM_BEFORE):
        if head == 0:
            break
        head = doc.rfind("\n", 0, head - 1) + 1
    end = cursor
    for _ in range(VIM_AFTER + 1):
        nl = doc.find("\n", end)
        if nl < 0:
            end = len(doc)
            break
        end = nl + 1
    return doc[head:cursor], doc[cursor:end]


class Texts:
    """Rebuilds a plan's left and right texts from its token counts, with the replay model's tokenizer."""

    def __init__(self, model: Path, n_ctx: int):
        from ..config import Config
        from ..engine.engine import make_planner
        from ..llama import Model

        self.model = Model(model, vocab_only=True)
        cfg = Config(model=str(model)).with_overrides(n_ctx_seq=n_ctx)
        _, self.planner = make_planner(self.model, cfg)
        self.reserve = cfg.max_tokens

    def close(self) -> None:
        self.model.close()

    def counts_full(self, doc: str, cursor: int, lead: int = 0) -> tuple[int, int]:
        """(left, right) tokens of the unbudgeted plan at ``cursor``, anchored at its line; ``lead``:
        tokens of repository context before the file, which take that much of the slot."""
        from dataclasses import replace

        from ..prompt.planner import FileSession

        planner = replace(self.planner, limits=replace(self.planner.limits, n_ctx=self.planner.limits.n_ctx - lead))
        plan = planner.plan(FileSession(layout="efim"), doc, cursor, "efim", reserve=self.reserve)
        return len(plan.prefix_tokens) + len(plan.middle_tokens), len(plan.suffix_tokens)

    def texts(self, doc: str, cursor: int, left: int, right: int, head: int = 0, gap: int = 0) -> tuple[str, str]:
        """The left text: the ``left - head`` tokens nearest the cursor, after the ``head`` tokens
        before a ``gap`` of dropped ones (a reduced plan's cached head); the right text: ``right``
        tokens after it. Only the text near the cursor is tokenized (as the planner does)."""
        span = self.planner.text_span(self.reserve)
        lt = self.model.tokenize(doc[max(0, cursor - 2 * span):cursor])
        rt = self.model.tokenize(doc[cursor:cursor + span])
        tail = max(0, len(lt) - (left - head))
        at = max(0, tail - gap - head)
        return (self.model.detokenize(lt[at:min(at + head, tail)] + lt[tail:]) if left else "",
                self.model.detokenize(rt[:right]) if right else "")


def prompt_tokens(scorer, left: str, right: str, form: str, limit: int) -> list[int]:
    """The scoring prompt: BOS and the left text (``left``), or PRE left SUF right MID (``fim``);
    cut from the far end of the context when it would not fit ``limit``."""
    m = scorer.model
    lt = scorer.tokenize(left)
    if form == "left":
        lt = lt[max(0, len(lt) - (limit - len(m.bos))):]
        return [*m.bos, *lt] if (m.bos or lt) else [*scorer.tokenize("\n")]
    fim = m.fim_ids()
    if not {"pre", "suf", "mid"} <= set(fim):
        raise ValueError(f"the scorer {m.path.name} has no FIM tokens: use form='left'")
    rt = scorer.tokenize(right)
    room = limit - len(m.bos) - 3
    while len(lt) + len(rt) > room:  # the farther text goes first
        if len(rt) > len(lt):
            rt = rt[:room - len(lt) if room > len(lt) else len(rt) // 2]
        else:
            lt = lt[len(lt) - max(room - len(rt), len(lt) // 2):]
    return [*m.bos, fim["pre"], *lt, fim["suf"], *rt, fim["mid"]]


def bootstrap(bits: dict[str, list[float]], chars: list[int], n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean bits per character (sum of bits / sum of characters) per condition with 95% percentile
    intervals from resampling requests, and the paired differences (same resamples) to ``full``
    and between ``used`` and ``llama.vim``: absolute and relative to the second condition."""
    rng = random.Random(seed)
    n = len(chars)
    names = list(bits)

    def bpc(idx: list[int]) -> dict[str, float]:
        c = sum(chars[i] for i in idx)
        return {k: sum(bits[k][i] for i in idx) / c for k in names}

    point = bpc(list(range(n)))
    pairs = [(a, b) for a, b in (("used", "full"), ("llama.vim", "full"), ("used", "llama.vim"))
             if a in bits and b in bits]
    draws = []
    for _ in range(n_boot):
        draws.append(bpc([rng.randrange(n) for _ in range(n)]))
    ci = lambda xs: (bu.pctl(xs, 0.025), bu.pctl(xs, 0.975))
    out = {"bpc": {k: {"mean": point[k], "ci95": ci([d[k] for d in draws])} for k in names}, "diff": {}}
    for a, b in pairs:
        out["diff"][f"{a} - {b}"] = {
            "mean": point[a] - point[b], "ci95": ci([d[a] - d[b] for d in draws]),
            "rel": point[a] / point[b] - 1, "rel_ci95": ci([d[a] / d[b] - 1 for d in draws])}
    return out


def run(cfg: ContextConfig) -> dict:
    """Replay ``cfg.trace`` paced through efim, then score each answered request's next text."""
    from . import trace as tr
    from .score import Scorer

    pc = paced.PacedConfig(cfg.model, max_requests=cfg.max_requests, n_ctx=cfg.n_ctx, threads=cfg.threads,
                           max_prompt_ms=cfg.max_prompt_ms, busy=cfg.busy, server=None, trace=cfg.trace,
                           pacing=cfg.pacing)
    replay = paced.run(pc)
    st = paced.steps(tr.load(tr.resolve(cfg.trace)), cfg.pacing)
    fired = paced.requests(st, cfg.pacing, cfg.max_requests)
    rows = replay["rows"]["efim"]
    texts = Texts(cfg.model, cfg.n_ctx)
    scorer_path = cfg.scorer or bu.gemma_path()
    bits: dict[str, list[float]] = {k: [] for k in CONDITIONS}
    ctx_tokens: dict[str, list[int]] = {k: [] for k in CONDITIONS}
    chars, kept = [], []
    skipped = {"nothing typed on the line": 0, "no plan": 0}
    try:
        # A sequence per context kind, so each reuses its own previous prompt.
        with Scorer(scorer_path, n_ctx=6144, threads=cfg.scorer_threads, n_seqs=len(CONDITIONS)) as scorer:
            limit = scorer.n_ctx - cfg.max_chars * 2
            for f, row in tqdm(list(zip(fired, rows)), desc="scoring", leave=False):
                target = typed_next(st, f.step, cfg.max_chars)
                if not target.strip():
                    skipped["nothing typed on the line"] += 1
                    continue
                if "context_prefix_tokens" not in row:  # superseded while queued, or the daemon did not say
                    skipped["no plan"] += 1
                    continue
                used = (row["context_prefix_tokens"] + row.get("context_middle_tokens", 0),
                        row["context_suffix_tokens"])
                sides = {"used": texts.texts(f.doc, f.cursor, *used, row.get("context_head_tokens", 0),
                                                    row.get("context_gap_tokens", 0)),
                         "full": texts.texts(f.doc, f.cursor, *texts.counts_full(f.doc, f.cursor)),
                         "llama.vim": vim_window(f.doc, f.cursor)}
                tt = scorer.tokenize(target)
                for sid, k in enumerate(CONDITIONS):
                    p = prompt_tokens(scorer, *sides[k], cfg.form, limit)
                    bits[k].append(scorer.bits(p, tt, sid))
                    ctx_tokens[k].append(len(p))
                chars.append(len(target))
                kept.append({"t": row["t"], "path": f.path, "target": target, "reduced": row.get("context_reduced"),
                             "shown": not row["stale"],
                             **{f"bits_{k}": bits[k][-1] for k in CONDITIONS},
                             **{f"tokens_{k}": ctx_tokens[k][-1] for k in CONDITIONS}})
            evaluated = scorer.evaluated
    finally:
        texts.close()
    summary, diffs = [], []
    subsets = {"planned": list(range(len(chars))), "shown": [i for i, r in enumerate(kept) if r["shown"]]}
    for name, idx in subsets.items():
        if not idx:
            continue
        sub = lambda xs, idx=idx: [xs[i] for i in idx]
        stats = bootstrap({k: sub(v) for k, v in bits.items()}, sub(chars), cfg.n_boot)
        summary += [{"requests": name, "n": len(idx), "context": k, "tokens_mean": bu.mean(sub(ctx_tokens[k])),
                     "tokens_p50": bu.pctl(sub(ctx_tokens[k]), 0.5), "bpc": stats["bpc"][k]["mean"],
                     "ci95_lo": stats["bpc"][k]["ci95"][0], "ci95_hi": stats["bpc"][k]["ci95"][1]}
                    for k in CONDITIONS]
        diffs += [{"requests": name, "pair": k, "bpc_diff": v["mean"], "ci95_lo": v["ci95"][0],
                   "ci95_hi": v["ci95"][1], "rel_pct": 100 * v["rel"], "rel_ci95_lo_pct": 100 * v["rel_ci95"][0],
                   "rel_ci95_hi_pct": 100 * v["rel_ci95"][1]} for k, v in stats["diff"].items()]
    return {"trace": str(cfg.trace or "efim"), "model": str(cfg.model), "scorer": str(scorer_path),
            "form": cfg.form, "max_prompt_ms": cfg.max_prompt_ms, "busy": cfg.busy, "requests": len(fired),
            "scored": len(chars), "skipped": skipped, "chars": sum(chars), "scorer_tokens_evaluated": evaluated,
            "summary": summary, "diffs": diffs, "paced": [s for s in replay["summary"]], "rows": kept}


def table(r: dict) -> str:
    """The context part's tables, as ``efim bench`` prints them."""
    head = (f"Context quality: {r['scored']} of {r['requests']} requests scored ({r['chars']} characters typed "
            f"next; not scored: {', '.join(f'{v} {k}' for k, v in r['skipped'].items())}), "
            f"{r['trace']} trace, scorer {Path(r['scorer']).name}, form {r['form']}, "
            f"budget {'default' if r['max_prompt_ms'] is None else r['max_prompt_ms']}"
            + ("; one core kept busy during the replay" if r.get("busy") else ""))
    if not r["summary"]:
        return head + "\n(no request to score)\n"
    return "\n".join([head, bu.table(r["summary"], list(r["summary"][0])),
                      bu.table(r["diffs"], list(r["diffs"][0])) if r["diffs"] else ""]) + "\n"
