"""Load test (`efim bench load`): N concurrent clients x M completions against a real daemon, checked
three ways.

Each client types into its own file (a character, then a completion, as an editor does after its
debounce). Then:

- errors: every request must be answered (0 errors);
- exactness: every ``replay_every``-th answer (default 20) is computed again from an empty cache in
  this process (same plan: no latency budget) and must be identical (0 mismatches);
- memory: the daemon's RSS, sampled every 0.2 s, must stay within its RSS before the first request +
  ``ram_mb`` (the RAM tier's budget) + a fixed overhead of OVERHEAD_MB for llama.cpp's compute
  buffers, open documents and the Python heap.

The result names the checks that failed (``failed``: the command exits 1 on any).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu

OVERHEAD_MB = 128  # llama.cpp compute buffers, documents, Python heap growth under load (stated, fixed)
N_CTX = 2048
WARM = 20  # requests per client before the warm RSS is sampled


@dataclass
class LoadConfig:
    model: str = "default"
    clients: int = 8
    requests: int = 200  # per client
    max_tokens: int = 8
    ram_mb: float = 512.0  # the daemon's RAM-tier budget (config ram_mb)
    replay_every: int = 20  # replay every N-th answer cold (1: all)
    out: Path = bu.RESULTS


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def hammer(cfg: LoadConfig, sock: Path, pid: int, progress: bool) -> dict:
    """The clients, all at once, with the daemon's RSS sampled meanwhile."""
    from ..daemon.client import Client

    base_rss = rss_kb(pid)  # model loaded, no request yet
    peak_rss = [base_rss]
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(0.2):
            peak_rss[0] = max(peak_rss[0], rss_kb(pid))

    sources = [p.read_text("utf-8", errors="replace")[:3000]
               for p in sorted(Path(os.__file__).parent.glob("*.py"))[:cfg.clients]]
    latencies: list[float] = []
    errors: list[str] = []
    sent: list[tuple[str, str, int, dict | None]] = []  # (path, text, offset, reply to replay or None), in order
    warm_rss: list[int] = []
    lock = threading.Lock()
    bar = tqdm(total=cfg.clients * cfg.requests, desc="requests", disable=not progress)
    barrier = threading.Barrier(cfg.clients, action=lambda: warm_rss.append(rss_kb(pid)))

    def client(i: int) -> None:
        text = sources[i]
        cur = len(text) // 2
        with Client(sock, timeout=120) as c:
            for k in range(cfg.requests):
                if k == WARM:
                    barrier.wait()  # every client is past warm-up: sample RSS
                ch = "abcdefghij "[k % 11]
                text, cur = text[:cur] + ch + text[cur:], cur + 1
                t = time.perf_counter()
                path = f"client{i}.py"
                reply = None
                try:
                    reply = c.call("complete", {"path": path, "text": text, "offset": cur,
                                                "max_tokens": cfg.max_tokens, "max_prompt_ms": 0})
                except Exception as e:  # noqa: BLE001 - counted
                    with lock:
                        errors.append(repr(e))
                with lock:
                    sent.append((path, text, cur, reply if k % cfg.replay_every == 0 else None))
                    latencies.append((time.perf_counter() - t) * 1e3)
                bar.update()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wall = bu.run_threads([threading.Thread(target=client, args=(i,)) for i in range(cfg.clients)])
    bar.close()
    stop_sampling.set()
    end_rss = rss_kb(pid)
    return {"base_rss": base_rss, "warm_rss": warm_rss, "end_rss": end_rss, "peak_rss": max(peak_rss[0], end_rss),
            "latencies": latencies, "errors": errors, "sent": sent, "wall": wall}


def cold_replays(cfg: LoadConfig, model: Path, template: str | None, sent, progress: bool) -> list[dict]:
    """Each client's requests planned again in order (so every file's anchors move as they did in the
    daemon), every ``replay_every``-th one decoded from an empty cache (no store, no budget)."""
    from ..config import Config, ContextParams
    from ..engine import CompletionRequest, Engine

    mismatches = []
    ecfg = Config(context=ContextParams(n_ctx_seq=N_CTX, n_slots=1), fim_template=template, max_prompt_ms=0)
    with Engine(ecfg, model) as eng:
        for path, text, cur, reply in tqdm(sent, desc="cold replays", disable=not progress):
            r = CompletionRequest(text, cur, path=path, max_tokens=cfg.max_tokens, max_prompt_ms=0)
            if reply is None:
                eng.plan(r)  # moves the file's anchor as the daemon's request did
                continue
            eng.clear_slots()  # nothing cached: the answer comes from an empty cache
            cold = eng.complete(r)
            if (cold.text, cold.stop_reason) != (reply["text"], reply["stop_reason"]):
                mismatches.append({"path": path, "offset": cur, "daemon": reply["text"], "cold": cold.text})
    return mismatches


def run(cfg: LoadConfig, log=print) -> dict:
    from ..daemon.client import Client

    model, template = bu.bench_model(cfg.model)
    proc, sock = bu.spawn_daemon(model, template, "--n-ctx", str(N_CTX), config={"ram_mb": cfg.ram_mb})
    try:
        h = hammer(cfg, sock, proc.pid, log is not None)
        with Client(sock) as c:
            ram_tier = c.call("status")["store"]["tiers"]["ram"]
            c.call("shutdown")
        proc.wait(60)
    finally:
        bu.end_daemon(proc)
    mismatches = cold_replays(cfg, model, template, h["sent"], log is not None)
    replayed = sum(reply is not None for *_, reply in h["sent"])

    base_rss, warm_rss, lat, errors = h["base_rss"], h["warm_rss"], h["latencies"], h["errors"]
    limit_kb = base_rss + cfg.ram_mb * 1024 + OVERHEAD_MB * 1024
    row = {"clients": cfg.clients, "requests": len(lat), "errors": len(errors),
           "replayed": replayed, "mismatches": len(mismatches),
           "p50_ms": bu.pctl(lat, 0.5), "p95_ms": bu.pctl(lat, 0.95), "req/s": len(lat) / h["wall"],
           "rss_start_mb": base_rss / 1024, "rss_warm_mb": warm_rss[0] / 1024 if warm_rss else float("nan"),
           "rss_end_mb": h["end_rss"] / 1024, "rss_peak_mb": h["peak_rss"] / 1024,
           "ram_tier_mb": ram_tier["bytes"] / 2**20, "ram_mb": cfg.ram_mb, "rss_limit_mb": limit_kb / 1024}
    failed = [name for name, bad in (("errors", errors), ("mismatches", mismatches),
                                     ("rss", h["peak_rss"] > limit_kb)) if bad]
    res = {"args": bu.options(cfg), "overhead_mb": OVERHEAD_MB, "result": row, "errors": errors[:20],
           "mismatches": mismatches[:20], "failed": failed}
    res["json"] = str(bu.save(f"load-{bu.model_name(cfg.model)}", res, cfg.out))
    if log is not None:
        log(bu.table([row], list(row)))
        log(f"RSS limit = RSS before the first request ({base_rss / 1024:.0f} MB) + ram_mb ({cfg.ram_mb:.0f}) "
            f"+ fixed overhead ({OVERHEAD_MB} MB)")
        if errors:
            log("\n  ".join(["first errors:", *errors[:5]]))
        if mismatches:
            log("\n  ".join(["first mismatches:", *map(str, mismatches[:5])]))
    return res
