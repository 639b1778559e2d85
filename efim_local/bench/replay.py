"""Edit-trace replay: the same typing session through each backend, one after another."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from . import util as bu
from . import peers, trace


@dataclass
class ReplayConfig:
    model: Path
    max_requests: int = 200  # per backend, taken from the trace's commits in order
    max_tokens: int = 32
    n_ctx: int = 8192
    threads: int = 0
    server: Path = peers.SERVER_BIN
    trace: Path = trace.DEFAULT_TRACE


def trace_requests(path: Path, limit: int) -> list[tuple[str, trace.Request]]:
    """(file, request) pairs of the trace's commits, in order, at most ``limit``."""
    def gen():
        for c in trace.load(path):
            for r in trace.requests(c):
                yield c.file, r
    return list(islice(gen(), limit))


def backends(cfg: ReplayConfig):
    """Yield each backend in turn, started and then closed; llama-server ones are skipped with a
    note when its binary is missing."""
    for layout in ("efim", "fim"):
        b = peers.EfimDaemon(cfg.model, layout, cfg.n_ctx, cfg.threads, cfg.max_tokens)
        try:
            yield b
        finally:
            b.close()
    if not cfg.server.exists():
        yield None
        return
    # A fresh server per backend: neither starts with the other's prompt cache.
    for make in (lambda srv: peers.ServerInfill(srv, cfg.max_tokens),
                 lambda srv: peers.ServerCompletion(srv, cfg.model, cfg.n_ctx, cfg.max_tokens)):
        server = peers.LlamaServer(cfg.server, cfg.model, cfg.n_ctx, cfg.threads)
        try:
            b = make(server)
            try:
                yield b
            finally:
                b.close()
        finally:
            server.close()


def run(cfg: ReplayConfig) -> dict:
    """Replay the trace through every backend; returns per-backend summaries and raw rows."""
    reqs = trace_requests(cfg.trace, cfg.max_requests)
    rows: dict[str, list[dict]] = {}
    notes = []
    for b in backends(cfg):
        if b is None:
            notes.append(f"llama-server not found at {cfg.server} (run `make server`): its rows are missing")
            break
        out = rows[b.name] = []
        for file, r in tqdm(reqs, desc=b.name, leave=False):
            a = b(file, r)
            out.append({"ttft_ms": a.ttft_ms, "total_ms": a.total_ms, "evaluated": a.evaluated})
    summary = [summarize(name, xs) for name, xs in rows.items()]
    base = next((s for s in summary if s["backend"] == peers.ServerInfill.name), None)
    for s in summary:
        s["ttft_p50_vs_infill"] = base["ttft_p50_ms"] / s["ttft_p50_ms"] if base else float("nan")
    return {"requests": len(reqs), "summary": summary, "rows": rows, "notes": notes,
            "files": sorted({f for f, _ in reqs})}


def summarize(name: str, xs: list[dict]) -> dict:
    ttft = [x["ttft_ms"] for x in xs]
    return {"backend": name, "requests": len(xs),
            "ttft_p50_ms": bu.pctl(ttft, 0.5), "ttft_p95_ms": bu.pctl(ttft, 0.95),
            "evaluated_p50": bu.pctl([x["evaluated"] for x in xs], 0.5),
            "evaluated_mean": bu.mean([x["evaluated"] for x in xs]),
            "total_s": sum(x["total_ms"] for x in xs) / 1e3}
