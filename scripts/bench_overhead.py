"""Daemon overhead: for a fully cached request, how much of the latency is IPC plus planning?

One client repeats the same completion (all prompt tokens cached in the slot)
against a real daemon. Overhead = (client round trip - engine time) + planning
time; the table shows it as a share of the round trip.

    python scripts/bench_overhead.py --model gemma
"""

import argparse
import os
import time
from pathlib import Path

from efim_local.bench import util as bu
from efim_local.daemon.client import Client

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="gemma", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--requests", type=int, default=50)
ap.add_argument("--max-tokens", type=int, default=16)
args = ap.parse_args()

proc, sock = bu.spawn_daemon(*bu.bench_model(args.model))

text = Path(os.__file__).read_text()[:12000]
params = {"path": "overhead.py", "text": text, "offset": 8000, "max_tokens": args.max_tokens, "layout": "efim"}
rows = []
with Client(sock, timeout=300) as c:
    c.call("complete", params)  # warm the slot
    for _ in range(args.requests):
        t = time.perf_counter()
        out = c.call("complete", params)
        rtt = (time.perf_counter() - t) * 1e3
        assert out["tokens"]["evaluated"] == 1, out["tokens"]
        engine = out["timings"]["total_ms"]
        plan = out["timings"]["plan_ms"]
        rows.append({"rtt": rtt, "engine": engine, "plan": plan, "overhead": rtt - engine + plan})
    c.call("shutdown")
proc.wait(60)

share = [r["overhead"] / r["rtt"] for r in rows]
p50 = lambda key: bu.pctl([r[key] for r in rows], 0.5)
row = {"model": args.model, "prompt_tokens": out["tokens"]["prompt"], "p50_rtt_ms": p50("rtt"),
       "p50_engine_ms": p50("engine"), "p50_plan_ms": p50("plan"),
       "p50_ipc+plan_ms": p50("overhead"), "p50_share_%": 100 * bu.pctl(share, 0.5),
       "p95_share_%": 100 * bu.pctl(share, 0.95)}
print(bu.table([row], list(row)))
name = args.model if args.model in ("default", "gemma") else "model"
print("saved", bu.save(f"overhead-{name}", {"args": vars(args), "result": row}))
