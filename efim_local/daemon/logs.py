"""The daemon's log (one line per request, rotated) and its request statistics for ``status``.

Only efim's own loggers (``efim.*``) log below WARNING, and DEBUG only with ``-v``: the file
watcher's and other libraries' chatter stays out. The log file is opened like every file in the
state directory (``paths.open_private``: no symbolic links, 0600), and rotated by size.
"""

from __future__ import annotations

import logging
import logging.handlers
import math
import os
import threading
import time
from collections import deque

from ..engine.completion import SOURCES
from . import paths

log = logging.getLogger("efim.daemon")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 4 << 20  # rotate past 4 MiB,
BACKUPS = 3  # keeping daemon.log.1 .. .3
WINDOW = 200  # requests the latency percentiles cover
MINUTE = 60.0  # s: status's recent context share covers the answers of the last minute


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose files are opened through ``paths.open_private``. With
    ``capture_stderr``, file descriptors 1 and 2 follow the current file across rotations, so a crash
    report (faulthandler, a dying thread) lands in the log too."""

    def __init__(self, filename, capture_stderr: bool = False):
        self.capture_stderr = capture_stderr
        super().__init__(filename, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8", delay=False)

    def _open(self):
        from pathlib import Path

        fd = paths.open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND)
        if self.capture_stderr:
            for std in (1, 2):
                os.dup2(fd, std)
        return os.fdopen(fd, "a", encoding=self.encoding)


def setup(verbose: bool, log_file=None) -> None:
    """Log efim's messages (INFO, or DEBUG with ``verbose``) to ``log_file`` (rotated; stderr follows
    it) or, without one, to stderr."""
    handler = PrivateRotatingFileHandler(log_file, capture_stderr=True) if log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries: warnings only
    logging.getLogger("efim").setLevel(logging.DEBUG if verbose else logging.INFO)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class RequestStats:
    """What the daemon answered: a log line per request, the latencies of the last ``WINDOW``
    requests, and per file how many requests found their prompt cached (thread-safe)."""

    def __init__(self, layout: str = "", layout_reason: str = ""):
        self.lock = threading.Lock()
        self.latencies: deque[float] = deque(maxlen=WINDOW)
        self.contexts: deque[tuple[int, float, bool]] = deque(maxlen=WINDOW)  # (tokens, share, reduced)
        self.recent: deque[tuple[float, float, bool]] = deque()  # (monotonic time, share, reduced), a minute's
        self.files: dict[str, list[int]] = {}  # path -> [requests, hits, cached tokens, prompt tokens]
        self.layout, self.layout_reason = layout, layout_reason
        self.first = True
        self.sources: dict[str, int] = {}  # where the answers came from (engine.completion.SOURCES)

    def record(self, path: str, out: dict) -> None:
        """One answered completion (its JSON): log it and count it."""
        tok, ms = out["tokens"], out["timings"]["total_ms"]
        with self.lock:
            first, self.first = self.first, False
            self.latencies.append(ms)
            ctx = out.get("context") or {}
            if "tokens" in ctx:
                self.contexts.append((ctx["tokens"], ctx["share"], ctx["reduced"]))
                self.recent.append((time.monotonic(), ctx["share"], ctx["reduced"]))
                self._forget()
            f = self.files.setdefault(path, [0, 0, 0, 0])
            f[0] += 1
            f[1] += tok["cached"] > 0
            f[2] += tok["cached"]
            f[3] += tok["prompt"]
            source = out.get("source", "computed")
            self.sources[source] = self.sources.get(source, 0) + 1
        if first:
            log.info("first request: layout %s (%s)", self.layout, self.layout_reason)
        why = ((out.get("context") or {}).get("reduced_by") or {}).get("text")
        log.info("complete %s layout=%s context=%s cached=%d evaluated=%d generated=%d tier=%s reanchor=%s source=%s "
                 "%.1f ms%s", path, out["layout"], context_text(out.get("context") or {}), tok["cached"],
                 tok["evaluated"], tok["generated"], out["cache_tier"], out["reanchor"] or "-",
                 out.get("source", "computed"), ms, f"; reduced by {why}" if why else "")

    def _forget(self) -> None:
        """Drop the answers older than a minute (under the lock)."""
        old = time.monotonic() - MINUTE
        while self.recent and self.recent[0][0] < old:
            self.recent.popleft()

    def summary(self) -> dict:
        with self.lock:
            self._forget()
            lat, ctx, sources, minute = list(self.latencies), list(self.contexts), dict(self.sources), list(self.recent)
            files = {p: {"requests": n, "hit_rate": round(h / n, 3), "cached_tokens": c, "prompt_tokens": t}
                     for p, (n, h, c, t) in self.files.items()}
        r = lambda v: None if v is None else round(v, 1)
        context = None
        if ctx:
            context = {"mean_tokens": r(sum(c[0] for c in ctx) / len(ctx)),
                       "median_tokens": percentile([c[0] for c in ctx], 50),
                       "mean_share": round(sum(c[1] for c in ctx) / len(ctx), 3),
                       "reduced": round(sum(c[2] for c in ctx) / len(ctx), 3),
                       "last_minute": {"requests": len(minute), "reduced": sum(c[2] for c in minute),
                                       "mean_share": round(sum(c[1] for c in minute) / len(minute), 3)
                                       if minute else None}}
        return {"window": len(lat), "p50_ms": r(percentile(lat, 50)), "p95_ms": r(percentile(lat, 95)),
                "context": context, "files": files, "sources": source_rates(sources)}


def source_rates(counts: dict[str, int]) -> dict:
    """Answers by source, and the share of each that did not have to be computed (hit rates)."""
    total = sum(counts.values())
    out = {"answers": total, **{s: counts.get(s, 0) for s in SOURCES}}
    for s in SOURCES[1:]:
        out[s.replace("-", "_") + "_rate"] = round(counts.get(s, 0) / total, 3) if total else None
    out["instant_rate"] = round((total - counts.get("computed", 0)) / total, 3) if total else None
    return out


def context_text(ctx: dict) -> str:
    """'1204/2950(41%,reduced)': the context tokens an answer used, of the full plan's (log lines)."""
    if "tokens" not in ctx:
        return "-"
    return f"{ctx['tokens']}/{ctx['full_tokens']}({ctx['share']:.0%}{',reduced' if ctx['reduced'] else ''})"
