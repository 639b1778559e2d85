"""Load test: N concurrent clients x M completions against a real daemon.

Each client types into its own file (a character, then a completion, as an
editor does after its debounce). Prints errors, latency percentiles and the
daemon's RSS after warm-up and at the end; saves bench-results/load.json.

    python scripts/load_daemon.py                      # 8 clients x 200 requests, default model
    python scripts/load_daemon.py --model gemma --requests 50
"""

import argparse
import os
import threading
import time
from pathlib import Path

from tqdm import tqdm

from efim_local.bench import util as bu
from efim_local.daemon.client import Client

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--max-tokens", type=int, default=8)
args = ap.parse_args()

proc, sock = bu.spawn_daemon(*bu.bench_model(args.model), "--n-ctx", "2048")


def rss_kb() -> int:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


sources = [p.read_text("utf-8", errors="replace")[:3000]
           for p in sorted(Path(os.__file__).parent.glob("*.py"))[:args.clients]]
latencies: list[float] = []
errors: list[str] = []
warm_rss: list[int] = []
lock = threading.Lock()
bar = tqdm(total=args.clients * args.requests, desc="requests")
barrier = threading.Barrier(args.clients, action=lambda: warm_rss.append(rss_kb()))


def client(i: int) -> None:
    text = sources[i]
    cur = len(text) // 2
    with Client(sock, timeout=120) as c:
        for k in range(args.requests):
            if k == 20:
                barrier.wait()  # every client is past warm-up: sample RSS
            ch = "abcdefghij "[k % 11]
            text, cur = text[:cur] + ch + text[cur:], cur + 1
            t = time.perf_counter()
            try:
                c.call("complete", {"path": f"client{i}.py", "text": text, "offset": cur,
                                    "max_tokens": args.max_tokens})
            except Exception as e:  # noqa: BLE001 - counted
                with lock:
                    errors.append(repr(e))
            with lock:
                latencies.append((time.perf_counter() - t) * 1e3)
            bar.update()


threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
bar.close()
end_rss = rss_kb()
with Client(sock) as c:
    c.call("shutdown")
proc.wait(60)

row = {"clients": args.clients, "requests": len(latencies), "errors": len(errors),
       "p50_ms": bu.pctl(latencies, 0.5), "p95_ms": bu.pctl(latencies, 0.95), "req/s": len(latencies) / wall,
       "rss_warm_mb": warm_rss[0] / 1024 if warm_rss else float("nan"), "rss_end_mb": end_rss / 1024,
       "rss_growth_mb": (end_rss - warm_rss[0]) / 1024 if warm_rss else float("nan")}
print(bu.table([row], list(row)))
if errors:
    print("first errors:", *errors[:5], sep="\n  ")
print("saved", bu.save(f"load-{args.model if args.model in ('default', 'gemma') else 'model'}",
                       {"args": vars(args), "result": row, "errors": errors[:20]}))
