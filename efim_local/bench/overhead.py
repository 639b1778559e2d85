"""Daemon overhead (`efim bench overhead`): for a fully cached request, how much of the latency is IPC
plus planning?

One client repeats the same completion (all prompt tokens cached in the slot) against a real daemon.
Overhead = (client round trip - engine time) + planning time; the table shows it as a share of the
round trip.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu


@dataclass
class OverheadConfig:
    model: str = "gemma"
    requests: int = 50
    max_tokens: int = 16
    out: Path = bu.RESULTS


def run(cfg: OverheadConfig, log=print) -> dict:
    from ..daemon.client import Client

    proc, sock = bu.spawn_daemon(*bu.bench_model(cfg.model))
    text = Path(os.__file__).read_text()[:12000]
    params = {"path": "overhead.py", "text": text, "offset": 8000, "max_tokens": cfg.max_tokens, "layout": "efim"}
    rows = []
    try:
        with Client(sock, timeout=300) as c:
            c.call("complete", params)  # warm the slot
            for _ in tqdm(range(cfg.requests), desc="overhead", disable=log is None):
                t = time.perf_counter()
                out = c.call("complete", params)
                rtt = (time.perf_counter() - t) * 1e3
                if out["tokens"]["evaluated"] > 1:
                    raise SystemExit(f"the request was not fully cached: {out['tokens']}")
                engine = out["timings"]["total_ms"]
                plan = out["timings"]["plan_ms"]
                rows.append({"rtt": rtt, "engine": engine, "plan": plan, "overhead": rtt - engine + plan})
            c.call("shutdown")
        proc.wait(60)
    finally:
        bu.end_daemon(proc)

    share = [r["overhead"] / r["rtt"] for r in rows]
    p50 = lambda key: bu.pctl([r[key] for r in rows], 0.5)  # noqa: E731
    row = {"model": cfg.model, "prompt_tokens": out["tokens"]["prompt"], "p50_rtt_ms": p50("rtt"),
           "p50_engine_ms": p50("engine"), "p50_plan_ms": p50("plan"),
           "p50_ipc+plan_ms": p50("overhead"), "p50_share_%": 100 * bu.pctl(share, 0.5),
           "p95_share_%": 100 * bu.pctl(share, 0.95)}
    res = {"args": bu.options(cfg), "result": row}
    res["json"] = str(bu.save(f"overhead-{bu.model_name(cfg.model)}", res, cfg.out))
    if log is not None:
        log(bu.table([row], list(row)))
    return res
