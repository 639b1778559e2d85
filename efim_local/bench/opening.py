"""The first ghost in a file just opened: how much of the full plan it was computed from, how long
after the open, and whether it matched what the commit typed there.

For each file of the traces whose text is 3k-10k tokens (``LO``..``HI``), a daemon gets ``didOpen``,
and the cursor where the commit first changes it (an editor restores the last position, or the user
jumps there), then, ``wait`` seconds later, a request there. Two conditions:

- ``new``: a file the daemon never saw (a fresh state directory): only the open-time warm helps;
- ``seen``: a file the user worked on an earlier day: a first daemon had it open until its idle work
  was done and was stopped (its states go to disk), and a second one, on the same state directory,
  serves the open (what the store holds from earlier days).

Each (file, condition, wait) runs on a daemon of its own (``seen``: on a copy of the earlier day's
state directory), so no request finds another's KV.
"""

from __future__ import annotations

import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import util as bu
from .editors import _position
from .paced import useful

LO, HI = 3000, 10_000  # tokens: the files this measures
WAITS = (0.5, 1.0, 2.0)  # seconds from the open to the first request
SETTLE_S = 60.0  # at most this long for the first day's idle work to end
TARGET_SHARE = 0.25  # issue 39: the first ghost's context share within 2 s of the open


@dataclass
class OpeningConfig:
    model: Path
    traces: tuple[str, ...] = ("efim", "click")
    files: int = 4  # per trace
    waits: tuple[float, ...] = WAITS
    conditions: tuple[str, ...] = ("new", "seen")
    n_ctx: int = 4096  # the daemon's default slot
    threads: int = 0
    max_tokens: int = 16
    seed: int = 0
    tokens: tuple[int, int] = (LO, HI)  # the files' sizes
    out: Path = bu.RESULTS


def pick_files(model: Path, traces: tuple[str, ...], per_trace: int, seed: int = 0,
               tokens: tuple[int, int] = (LO, HI)) -> list[dict]:
    """Files of ``tokens`` (lo, hi) tokens from each trace, each with its commit's first change (the
    cursor) and the text the commit put there."""
    from ..llama import Model
    from . import trace as tr

    out = []
    with Model(model, vocab_only=True) as m:
        for name in traces:
            seen, picks = set(), []
            for c in tr.load(tr.resolve(name)):
                if c.file in seen or c.before == c.after:
                    continue
                seen.add(c.file)
                n = len(m.tokenize(c.before))
                if tokens[0] <= n <= tokens[1]:
                    picks.append((c, n))
            random.Random(seed).shuffle(picks)
            for c, n in picks[:per_trace]:
                k = next((i for i, (a, b) in enumerate(zip(c.before, c.after)) if a != b),
                         min(len(c.before), len(c.after)))
                typed = c.after[k:len(c.after) - (len(c.before) - k)] if len(c.after) > len(c.before) else ""
                out.append({"trace": name, "file": c.file, "text": c.before, "cursor": k, "tokens": n,
                            "typed_next": typed[:80]})
    return out


def _daemon(cfg: OpeningConfig, home: Path):
    return bu.spawn_daemon(cfg.model, None, "--layout", "efim", "--n-ctx", str(cfg.n_ctx), "--threads",
                           str(cfg.threads), config={"max_tokens": cfg.max_tokens}, home=home)


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)  # a clean stop: dirty slots and RAM states go to disk
    try:
        proc.wait(60)
    except Exception:  # noqa: BLE001 - it did not stop: it is killed
        proc.kill()
        proc.wait(10)


def _settle(c) -> None:
    """Wait until the daemon's idle work (the open file's warm and growth) is done, or ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    time.sleep(1.0)
    while time.monotonic() < deadline:
        st = c.call("status")
        if not st.get("idle_tasks") and not st.get("queued"):
            break
        time.sleep(0.5)


def earlier_day(cfg: OpeningConfig, f: dict) -> Path:
    """A state directory where a daemon had ``f`` open, at its cursor, until its idle work was done."""
    from ..daemon.client import Client

    home = Path(tempfile.mkdtemp(prefix="efim-opening-"))
    proc, sock = _daemon(cfg, home)
    try:
        with Client(sock, timeout=120) as c:
            path = _path(home, f)
            c.call("didOpen", {"path": path, "text": f["text"], "version": 0})
            c.notify("cursor", {"path": path, "offset": f["cursor"]})
            _settle(c)
    finally:
        _stop(proc)
    return home


def _path(home: Path, f: dict) -> str:
    return str(home / "src" / f["file"])  # the same path both days (the store keys states by file)


def one(cfg: OpeningConfig, f: dict, condition: str, wait: float, seen: Path | None = None) -> dict:
    """The first request ``wait`` s after opening ``f`` under ``condition`` (``seen``: a copy of the
    earlier day's state directory): one row."""
    from ..daemon.client import Client

    home = Path(tempfile.mkdtemp(prefix="efim-opening-"))
    if condition == "seen":
        shutil.copytree(seen, home, dirs_exist_ok=True, ignore=shutil.ignore_patterns("run"))
    path = _path(home, f)
    proc, sock = _daemon(cfg, home)
    try:
        time.sleep(2.0)  # the daemon measures its prefill speed when idle after start (as paced.py)
        with Client(sock, timeout=120) as c:
            c.call("didOpen", {"path": path, "text": f["text"], "version": 0})
            t_open = time.perf_counter()
            c.notify("cursor", {"path": path, "offset": f["cursor"]})  # the editor's restored position
            time.sleep(max(0.0, wait - (time.perf_counter() - t_open)))
            t = time.perf_counter()
            res = c.call("complete", {"path": path, "position": _position(f["text"], f["cursor"]),
                                      "max_tokens": cfg.max_tokens})
            ms = (time.perf_counter() - t) * 1e3
            st = c.call("status")
    finally:
        _stop(proc)
        shutil.rmtree(home, ignore_errors=True)
    ctx, hits = res.get("context", {}), st["store"]["hits"]
    return {"trace": f["trace"], "file": f["file"], "file_tokens": f["tokens"], "condition": condition,
            "wait_s": wait, "since_open_s": round(t - t_open + ms / 1e3, 3), "total_ms": round(ms, 1),
            "context_tokens": ctx.get("tokens"), "full_tokens": ctx.get("full_tokens"), "share": ctx.get("share"),
            "head_tokens": ctx.get("head_tokens"), "cache_tier": res.get("cache_tier"),
            # a saved state restored (at the open or the request)
            "restored": hits.get("ram", 0) + hits.get("disk", 0) > 0,
            "prefill_tok_s": st.get("prefill_tok_s"), "cores_used_by_others": st.get("cores_used_by_others"),
            "reduced": ctx.get("reduced"), "text": res.get("text", "")[:80], "typed_next": f["typed_next"],
            "useful": useful(res.get("text", ""), f["typed_next"]) if f["typed_next"] else None}


def run(cfg: OpeningConfig, log=print) -> dict:
    """Every picked file under every condition and wait; rows and a summary per (condition, wait)."""
    from tqdm import tqdm

    files = pick_files(cfg.model, cfg.traces, cfg.files, cfg.seed, cfg.tokens)
    rows = []
    with tqdm(total=len(files) * len(cfg.conditions) * len(cfg.waits), desc="opening", disable=log is None) as bar:
        for f in files:
            seen = earlier_day(cfg, f) if "seen" in cfg.conditions else None
            for cond in cfg.conditions:
                for w in cfg.waits:
                    rows.append(one(cfg, f, cond, w, seen))
                    bar.update(1)
            if seen is not None:
                shutil.rmtree(seen, ignore_errors=True)
    summary = summarize(rows)
    path = bu.save("opening", {"config": {k: str(v) for k, v in vars(cfg).items()}, "summary": summary,
                               "rows": rows}, cfg.out)
    res = {"summary": summary, "rows": rows, "json": str(path)}
    if log is not None:
        log(table(res))
    return res


def summarize(rows: list[dict]) -> list[dict]:
    """Per condition and wait: the share's distribution and how many reached ``TARGET_SHARE``."""
    out = []
    for cond in sorted({r["condition"] for r in rows}):
        for w in sorted({r["wait_s"] for r in rows}):
            rs = [r for r in rows if r["condition"] == cond and r["wait_s"] == w]
            if not rs:
                continue
            sh = [r["share"] or 0.0 for r in rs]
            us = [r["useful"] for r in rs if r["useful"] is not None]
            out.append({"condition": cond, "wait_s": w, "files": len(rs), "share_min": round(min(sh), 3),
                        "share_p50": round(bu.pctl(sh, 0.5), 3), "share_max": round(max(sh), 3),
                        f"at_least_{int(TARGET_SHARE * 100)}%": sum(s >= TARGET_SHARE for s in sh),
                        "tokens_p50": bu.pctl([r["context_tokens"] or 0 for r in rs], 0.5),
                        "total_ms_p50": round(bu.pctl([r["total_ms"] for r in rs], 0.5)),
                        "restored": sum(r["restored"] for r in rs),
                        "prefill_tok_s": round(bu.pctl([r["prefill_tok_s"] or 0 for r in rs], 0.5)),
                        "useful": f"{sum(us)}/{len(us)}" if us else "-"})
    return out


def table(res: dict) -> str:
    s = res["summary"]
    return bu.table(s, list(s[0])) if s else "(no file of 3k-10k tokens in the traces)"


