"""A paced replay: the edit trace typed at human speed, with an editor's traffic.

The back-to-back replay (``replay.py``) sends one request after another as fast as the backend
answers. A person types at their own pace, and the editor fires a request only when typing pauses
for its debounce; an answer that arrives after the next keystroke is stale. This replay models that:

- keystrokes with log-normal gaps (median 180 ms), 600 ms more at a line end, 2 s when the cursor
  jumps to the next hunk, 3 s after a file is opened (fixed defaults, so runs compare);
- auto-pairs as editors insert them: typing ``(`` also inserts ``)`` after the cursor, and typing
  the closer over an inserted one only moves the cursor (same for brackets, braces and quotes);
- the editor's traffic to efim: ``didOpen`` when a file opens, ``didChange`` per keystroke, a
  ``cursor`` notification when the cursor settles on a new line, ``complete`` after the debounce,
  ``cancel`` of a request still running when the next key is typed (as the Neovim plugin and
  llama.vim do); to llama-server ``/infill`` (llama.vim's request shape) the same requests at the
  same moments, a running one cancelled by closing its connection.

Per request: time to first token as the editor sees it, the first streamed text received at the
client (efim's ``completion/partial``, ``/infill``'s first ``content``), whether it was stale (no
text before the next keystroke), and the context it used. ``ttft_derived_ms`` keeps the older
estimate from the backend's timings (send + ``prompt_ms`` when cancelled, end - ``predict_ms``
otherwise), which stops at the end of the prefill: it leaves out sampling, text that healing or a
stop-string hold-back keeps back, IPC, and a cancelled request's queueing. Random-weight models
must stream text for every token (shape_models.py gives their padding tokens printable text).
"""

from __future__ import annotations

import difflib
import math
import os
import random
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from . import util as bu
from .editors import Fired, InfillEditor, Outcome, Step, displayed, spawn_efim
from .trace import Commit

PAIRS = {"(": ")", "[": "]", "{": "}", '"': '"', "'": "'"}


@dataclass(frozen=True)
class Pacing:
    median_gap_s: float = 0.18
    sigma: float = 0.5  # of the log-normal gaps
    line_end_s: float = 0.6
    jump_s: float = 2.0
    open_s: float = 3.0
    debounce_s: float = 0.15  # the Neovim plugin's default
    auto_pairs: bool = True
    seed: int = 0


def steps(commits: list[Commit], pacing: Pacing = Pacing()) -> list[Step]:
    """The editor events of typing ``commits`` (each on its file's previous version)."""
    rng = random.Random(pacing.seed)
    gap = lambda: rng.lognormvariate(math.log(pacing.median_gap_s), pacing.sigma)
    out: list[Step] = []
    t = 0.0
    for c in commits:
        doc = c.before
        out.append(Step(t, c.file, "open", doc, 0))
        t += pacing.open_s
        old, new = c.before.splitlines(keepends=True), c.after.splitlines(keepends=True)
        starts = [0]
        for line in old:
            starts.append(starts[-1] + len(line))
        shift = 0
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            pos, end = starts[i1] + shift, starts[i2] + shift
            doc = doc[:pos] + doc[end:]
            t += pacing.jump_s
            out.append(Step(t, c.file, "jump", doc, pos, (pos, end, "")))
            closers: list[int] = []  # auto-inserted closers, as distances from the document's end
            cur = pos
            for ch in "".join(new[j1:j2]):
                t += gap()
                from_end = len(doc) - cur
                if closers and closers[-1] == from_end and doc[cur:cur + 1] == ch:
                    closers.pop()  # typed over the closer the editor inserted
                    cur += 1
                    out.append(Step(t, c.file, "over", doc, cur))
                    continue
                ins = ch
                prev = doc[cur - 1:cur]
                if pacing.auto_pairs and ch in PAIRS and not (ch in "\"'" and (prev.isalnum() or prev == ch)):
                    ins = ch + PAIRS[ch]
                    closers.append(from_end + 1)
                doc = doc[:cur] + ins + doc[cur:]
                out.append(Step(t, c.file, "key", doc, cur + 1, (cur, cur, ins)))
                cur += 1
                if ch == "\n":
                    t += pacing.line_end_s
            if closers:  # closers the commit never typed: the user deletes them
                t += gap()
                for from_end in reversed(closers):  # leftmost first: the others keep their distance
                    k = len(doc) - from_end
                    doc = doc[:k] + doc[k + 1:]
                    out.append(Step(t, c.file, "cleanup", doc, cur, (k, k + 1, "")))
            shift += cur - pos - (starts[i2] - starts[i1])
        assert doc == c.after, "the paced replay must end on the commit's text"
    return out


def requests(trace_steps: list[Step], pacing: Pacing = Pacing(), limit: int | None = None) -> list[Fired]:
    """Requests fire when typing pauses for the debounce after a keystroke."""
    out = []
    for i, s in enumerate(trace_steps):
        if s.kind not in ("key", "over", "jump"):
            continue
        nxt = trace_steps[i + 1].t if i + 1 < len(trace_steps) else math.inf
        if nxt - s.t > pacing.debounce_s:
            out.append(Fired(i, s.t + pacing.debounce_s, s.path, s.doc, s.cursor, nxt))
            if limit and len(out) >= limit:
                break
    return out


def replay(editor, trace_steps: list[Step], fired: list[Fired], desc: str | None = None) -> list[dict]:
    """Play the steps and requests in real time through ``editor``; one row per request."""
    events = sorted([(s.t, 0, i) for i, s in enumerate(trace_steps)] + [(f.t, 1, j) for j, f in enumerate(fired)])
    last = fired[-1].t if fired else 0.0
    outcomes: list[Outcome | None] = [None] * len(fired)
    threads: list[threading.Thread] = []
    t0 = time.perf_counter()
    prev = None
    bar = tqdm(total=len(fired), desc=desc or editor.name, leave=False)
    for t, kind, i in events:
        if t > last:
            break
        delay = t0 + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if kind == 0:
            if threads and threads[-1].is_alive() and trace_steps[i].kind != "open":
                editor.cancel(threads[-1])  # the user typed on
            editor.event(trace_steps[i], prev)
            prev = trace_steps[i]
            continue
        out = outcomes[i] = Outcome(time.perf_counter())
        if threads and threads[-1].is_alive():
            editor.cancel(threads[-1])
        th = threading.Thread(target=editor.fire, args=(fired[i], out), daemon=True)
        th.start()
        threads.append(th)
        bar.update(1)
    bar.close()
    for th in threads:
        th.join(600)
    opened: dict[str, float] = {}  # each request's file: when it was last opened, as of the request
    since, i = [], 0
    for f in fired:
        for s in trace_steps[i:f.step + 1]:
            if s.kind == "open":
                opened[s.path] = s.t
        i = f.step + 1
        since.append(round(f.t - opened.get(f.path, 0.0), 3))
    shown = displayed(trace_steps, fired, outcomes, t0)
    rows = []
    for f, o, since_open, seen in zip(fired, outcomes, since, shown):
        next_key = t0 + f.next_key_t
        ghost = "".join(text for t, text in o.pieces if t <= next_key)  # what the user saw before typing on
        typed = typed_next(trace_steps, f.step)
        ttft = (o.t_first - o.t_send) * 1e3 if o.t_first else None
        derived = (o.t_first_derived - o.t_send) * 1e3 if o.t_first_derived else None
        rows.append({"t": round(f.t, 3), "path": f.path, "since_open_s": since_open, "ttft_ms": ttft,
                     "ttft_derived_ms": derived,
                     "cancelled": o.cancelled,
                     "stale": o.t_first is None or o.t_first > next_key,  # no ghost before the next key
                     "evaluated": o.evaluated, "cached": o.cached, "reanchor": o.reanchor, "wait_ms": o.wait_ms,
                     "source": o.source, "useful": useful(ghost, typed), "ghost": ghost[:80], "typed_next": typed,
                     "shown": seen[:80], "useful_shown": useful(seen, typed),
                     **{f"context_{k}": v for k, v in o.context.items()}})
    return rows


USEFUL_CHARS = 4  # a ghost is useful when its first line matches this many characters the user typed next
TYPED_PEEK = 80  # characters of what the user typed next kept per request


def typed_next(trace_steps: list[Step], i: int) -> str:
    """What the user typed at the cursor after step ``i``, until they moved elsewhere (an
    auto-inserted closer, typed by the editor, is not the user's)."""
    s0 = trace_steps[i]
    cur, doc, out = s0.cursor, s0.doc, ""
    for s in trace_steps[i + 1:]:
        if s.path != s0.path or s.kind not in ("key", "over") or len(out) >= TYPED_PEEK:
            break
        if s.kind == "over":  # typed over a closer: the character under the cursor
            out += doc[cur:cur + 1]
        elif s.change is not None and s.change[0] == s.change[1] == cur and s.cursor > cur:
            out += s.change[2][:s.cursor - cur]
        else:
            break
        cur, doc = s.cursor, s.doc
    return out[:TYPED_PEEK]


def useful(ghost: str, typed: str) -> bool:
    """Whether a ghost's first line matches what the user typed next for ``USEFUL_CHARS`` characters
    (or all of that line, when it is shorter). When the user went on to a new line, the first line
    is the first one with content, with the line breaks and indentation before it, which count for
    nothing themselves (a ghost that starts on the next line must get them and 4 characters right)."""
    lead = len(typed) - len(typed.lstrip(" \t\n")) if typed.startswith("\n") else 0
    g, t = _first_line(ghost, lead), _first_line(typed, lead)
    n = len(os.path.commonprefix([g, t]))
    return n > lead and n - lead >= min(USEFUL_CHARS, len(t) - lead)


def _first_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text if end < 0 else text[:end]


SETTLED_S = 5.0  # seconds after a file opens from which its context counts as settled


def summarize(name: str, rows: list[dict], full_tokens: list[int] | None = None) -> dict:
    ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    s = {"backend": name, "requests": len(rows), "answered": len(ttft),
         "stale_frac": sum(r["stale"] for r in rows) / max(1, len(rows)),
         "useful_frac": sum(bool(r.get("useful")) for r in rows) / max(1, len(rows)),
         # with what the editor shows meanwhile: the rest of a ghost typed through (``displayed``)
         "shown_frac": sum(bool(r.get("shown")) for r in rows) / max(1, len(rows)),
         "useful_shown_frac": sum(bool(r.get("useful_shown")) for r in rows) / max(1, len(rows)),
         "ttft_p50_ms": bu.pctl(ttft, 0.5), "ttft_p95_ms": bu.pctl(ttft, 0.95), "ttft_p99_ms": bu.pctl(ttft, 0.99),
         **_derived(rows),
         "wait_p95_ms": bu.pctl([r["wait_ms"] for r in rows if r["wait_ms"] is not None], 0.95),
         # prompt tokens evaluated per answered request (a keystroke's cost; healing backs off a few)
         "evaluated_p50": bu.pctl([r["evaluated"] for r in rows if r["evaluated"] is not None], 0.5)}
    reasons = [r["reanchor"] for r in rows if r.get("reanchor")]
    if reasons:  # efim's answers that moved their anchor, by reason (auto-pairs must not be among them)
        s["reanchors"] = {k: reasons.count(k) for k in sorted(set(reasons))}
    if full_tokens and any("context_prefix_tokens" in r for r in rows):
        fr = [(r["context_prefix_tokens"] + r["context_suffix_tokens"]) / max(1, full)
               for r, full in zip(rows, full_tokens) if "context_prefix_tokens" in r]
        s["context_frac_mean"] = bu.mean([min(1.0, x) for x in fr])  # every request that was planned
        shown = [min(1.0, (r["context_prefix_tokens"] + r["context_suffix_tokens"]) / max(1, full))
                 for r, full in zip(rows, full_tokens) if "context_prefix_tokens" in r and not r["stale"]]
        s["context_frac_shown"] = bu.mean(shown)  # the requests whose ghost came before the next key
        s["reduced_frac"] = sum(bool(r.get("context_reduced")) for r in rows) / max(1, len(fr))
        # The context once a file has been open a while (the "from the 5th second"), in tokens
        settled = [r["context_prefix_tokens"] + r["context_suffix_tokens"] for r in rows
                   if "context_prefix_tokens" in r and r.get("since_open_s", 0) >= SETTLED_S]
        if settled:
            s["context_median_tokens_5s"] = bu.pctl(settled, 0.5)
    s.update(_repo(rows))
    return s


def _repo(rows: list[dict]) -> dict:
    """Repository context (``--repo-context``): the lead's tokens per tier, and the requests that had
    to prefill some of it again (cached fewer tokens than its lead), by re-anchor reason: a keystroke
    must never be among them (the switch to a rebuilt lead, ``repo_context``, is prefilled in idle
    time, so its cached count covers the lead too)."""
    planned = [r for r in rows if isinstance(r.get("context_repo"), dict)]
    if not planned:
        return {}
    with_lead = [r for r in planned if r["context_repo"].get("tokens")]
    again = [r for r in with_lead if r.get("cached") is not None and r["cached"] < r["context_repo"]["tokens"]]
    return {"repo_requests": len(with_lead), "repo_share": len(with_lead) / len(planned),
            **{f"repo_{k}_mean": bu.mean([r["context_repo"].get(k, 0) for r in with_lead])
               for k in ("t0_tokens", "t1_tokens", "t2_tokens", "tokens")},
            "repo_lead_prefilled_again": {k: sum(1 for r in again if (r.get("reanchor") or "none") == k)
                                          for k in sorted({r.get("reanchor") or "none" for r in again})}}


def _derived(rows: list[dict]) -> dict:
    """The older, derived time to first token, over the requests it exists for."""
    xs = [r["ttft_derived_ms"] for r in rows if r.get("ttft_derived_ms") is not None]
    # Per request with both: how long after the end of its prefill its first text reached the client.
    gap = [r["ttft_ms"] - r["ttft_derived_ms"] for r in rows
           if r.get("ttft_derived_ms") is not None and r["ttft_ms"] is not None]
    return {"derived_p50_ms": bu.pctl(xs, 0.5), "derived_p95_ms": bu.pctl(xs, 0.95),
            "text_after_prefill_p50_ms": bu.pctl(gap, 0.5), "text_after_prefill_p95_ms": bu.pctl(gap, 0.95)}


@dataclass
class PacedConfig:
    model: Path
    max_requests: int = 200
    max_tokens: int = 16
    n_ctx: int = 8192
    threads: int = 0
    max_prompt_ms: float | None = 0.0  # efim's latency budget (0: off; None: the config's default)
    busy: bool = False  # keep one core busy with another process the whole time
    server: Path | None = None  # llama-server binary; None: efim only
    trace: Path | str | None = None  # a trace's name (trace.TRACES) or path; None: the default
    pacing: Pacing = Pacing()
    user: bool = False  # also replay with a simulated user who accepts matching suggestions (user.py)
    repo: Path | None = None  # repository context on: the trace's files are these paths under this git tree


def full_tokens(model: Path, fired: list[Fired], n_ctx: int) -> list[int]:
    """Prefix + suffix tokens of each request's full plan (what an unbudgeted plan would hold)."""
    from ..llama import Model

    with Model(model, vocab_only=True) as m:
        return [min(n_ctx, len(m.tokenize(f.doc[:f.cursor])) + len(m.tokenize(f.doc[f.cursor:]))) for f in fired]


def run(cfg: PacedConfig) -> dict:
    """The paced replay through efim and (when its binary exists) llama-server /infill."""
    import subprocess
    import sys

    from . import trace as tr
    from .peers import LlamaServer

    commits = tr.load(tr.resolve(cfg.trace))
    if cfg.repo is not None:  # the files in their work tree (absolute paths), so that the daemon finds the project
        commits = [replace(c, file=str(cfg.repo.resolve() / c.file)) for c in commits]
    st = steps(commits, cfg.pacing)
    fired = requests(st, cfg.pacing, cfg.max_requests)
    st = st[:fired[-1].step + 2] if fired else st
    full = full_tokens(cfg.model, fired, cfg.n_ctx)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if cfg.busy else None
    rows, notes, threads, engine_time = {}, [], {}, {}
    try:
        proc, ed = spawn_efim(cfg)
        try:
            rows["efim"] = replay(ed, st, fired)
            st_ = ed.ctl.call("status")  # the threads it ended with, and why
            threads = {k: st_.get(k) for k in ("threads", "threads_batch", "threads_auto", "cores_free",
                                               "cores_used_by_others")}
            engine_time = st_.get("engine_time_s", {})  # where the engine's time went
        finally:
            ed.close()
            proc.terminate()
            proc.wait(30)
        if cfg.server is not None and cfg.server.exists():
            server = LlamaServer(cfg.server, cfg.model, cfg.n_ctx, cfg.threads)
            try:
                rows[InfillEditor.name] = replay(InfillEditor(server, cfg.max_tokens), st, fired)
            finally:
                server.close()
        elif cfg.server is not None:
            notes.append(f"llama-server not found at {cfg.server} (run `make server`): its rows are missing")
    finally:
        if hog is not None:
            hog.kill()
    user_res = None
    if cfg.user:  # a fresh daemon: the same trace with a user who accepts what matches (user.py)
        from .user import run_user

        user_res = run_user(cfg, st)
    summary = [summarize(name, r, full) for name, r in rows.items()]
    base = next((s for s in summary if s["backend"] == InfillEditor.name), None)
    for s in summary:
        for q in ("p50", "p95"):
            s[f"ttft_{q}_vs_infill"] = base[f"ttft_{q}_ms"] / s[f"ttft_{q}_ms"] if base else float("nan")
    return {"trace": str(cfg.trace or "efim"), "requests": len(fired),
            "keystrokes": sum(s.kind in ("key", "over") for s in st),
            "auto_pair_keys": sum(s.kind == "over" for s in st) + sum(
                1 for s in st if s.kind == "key" and s.change and len(s.change[2]) == 2),
            "duration_s": st[-1].t if st else 0, "busy": cfg.busy, "max_prompt_ms": cfg.max_prompt_ms,
            "summary": summary, "rows": rows, "full_tokens": full, "notes": notes, "efim_threads": threads,
            "engine_time_s": engine_time, **({"user": user_res} if user_res is not None else {})}
