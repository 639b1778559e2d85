"""Load test: N concurrent clients x M completions against a real daemon, checked three ways.

Each client types into its own file (a character, then a completion, as an editor does after its
debounce). The script then checks:

- errors: every request must be answered (0 errors);
- exactness: every ``--replay-every``-th answer (default 20) is computed again from an empty cache in this
  process (same plan: no latency budget) and must be identical (0 mismatches);
- memory: the daemon's RSS, sampled every 0.2 s, must stay within its RSS before the first
  request + ``ram_mb`` (the RAM tier's budget) + a fixed overhead of OVERHEAD_MB for llama.cpp's
  compute buffers, open documents and the Python heap.

Prints a table, saves bench-results/load-*.json and exits 1 if a check fails.

    python scripts/load_daemon.py                      # 8 clients x 200 requests, default model
    python scripts/load_daemon.py --model gemma --requests 50 --ram-mb 64
"""

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from efim_local.bench import util as bu
from efim_local.daemon.client import Client

OVERHEAD_MB = 128  # llama.cpp compute buffers, documents, Python heap growth under load (stated, fixed)

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--max-tokens", type=int, default=8)
ap.add_argument("--ram-mb", type=float, default=512.0, help="the daemon's RAM-tier budget (config ram_mb)")
ap.add_argument("--replay-every", type=int, default=20, help="replay every N-th answer cold (1: all)")
args = ap.parse_args()

model, template = bu.bench_model(args.model)
N_CTX = 2048
proc, sock = bu.spawn_daemon(model, template, "--n-ctx", str(N_CTX), config={"ram_mb": args.ram_mb})


def rss_kb() -> int:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


base_rss = rss_kb()  # model loaded, no request yet
peak_rss = [base_rss]
stop_sampling = threading.Event()


def sample() -> None:
    while not stop_sampling.wait(0.2):
        peak_rss[0] = max(peak_rss[0], rss_kb())


sources = [p.read_text("utf-8", errors="replace")[:3000]
           for p in sorted(Path(os.__file__).parent.glob("*.py"))[:args.clients]]
latencies: list[float] = []
errors: list[str] = []
sent: list[tuple[str, str, int, dict | None]] = []  # (path, text, offset, reply to replay or None), in order
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
            path = f"client{i}.py"
            reply = None
            try:
                reply = c.call("complete", {"path": path, "text": text, "offset": cur,
                                            "max_tokens": args.max_tokens, "max_prompt_ms": 0})
            except Exception as e:  # noqa: BLE001 - counted
                with lock:
                    errors.append(repr(e))
            with lock:
                sent.append((path, text, cur, reply if k % args.replay_every == 0 else None))
            with lock:
                latencies.append((time.perf_counter() - t) * 1e3)
            bar.update()


sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
bar.close()
stop_sampling.set()
end_rss = rss_kb()
peak = max(peak_rss[0], end_rss)
with Client(sock) as c:
    ram_tier = c.call("status")["store"]["tiers"]["ram"]
    c.call("shutdown")
proc.wait(60)

# Cold replays: each client's requests planned again in order (so every file's anchors move as they
# did in the daemon), every --replay-every-th one decoded from an empty cache (no store, no budget).
from efim_local.config import Config, ContextParams  # noqa: E402
from efim_local.engine import CompletionRequest, Engine  # noqa: E402

mismatches = []
cfg = Config(context=ContextParams(n_ctx_seq=N_CTX, n_slots=1), fim_template=template, max_prompt_ms=0)
with Engine(cfg, model) as eng:
    for path, text, cur, reply in tqdm(sent, desc="cold replays"):
        r = CompletionRequest(text, cur, path=path, max_tokens=args.max_tokens, max_prompt_ms=0)
        if reply is None:
            eng.plan(r)  # moves the file's anchor as the daemon's request did
            continue
        eng.clear_slots()  # nothing cached: the answer comes from an empty cache
        cold = eng.complete(r)
        if (cold.text, cold.stop_reason) != (reply["text"], reply["stop_reason"]):
            mismatches.append({"path": path, "offset": cur, "daemon": reply["text"], "cold": cold.text})
replayed = sum(reply is not None for *_, reply in sent)

limit_kb = base_rss + args.ram_mb * 1024 + OVERHEAD_MB * 1024
row = {"clients": args.clients, "requests": len(latencies), "errors": len(errors),
       "replayed": replayed, "mismatches": len(mismatches),
       "p50_ms": bu.pctl(latencies, 0.5), "p95_ms": bu.pctl(latencies, 0.95), "req/s": len(latencies) / wall,
       "rss_start_mb": base_rss / 1024, "rss_warm_mb": warm_rss[0] / 1024 if warm_rss else float("nan"),
       "rss_end_mb": end_rss / 1024, "rss_peak_mb": peak / 1024, "ram_tier_mb": ram_tier["bytes"] / 2**20,
       "ram_mb": args.ram_mb, "rss_limit_mb": limit_kb / 1024}
print(bu.table([row], list(row)))
print(f"RSS limit = RSS before the first request ({base_rss / 1024:.0f} MB) + ram_mb ({args.ram_mb:.0f}) "
      f"+ fixed overhead ({OVERHEAD_MB} MB)")
if errors:
    print("first errors:", *errors[:5], sep="\n  ")
if mismatches:
    print("first mismatches:", *mismatches[:5], sep="\n  ")
print("saved", bu.save(f"load-{args.model if args.model in ('default', 'gemma') else 'model'}",
                       {"args": vars(args), "overhead_mb": OVERHEAD_MB, "result": row, "errors": errors[:20],
                        "mismatches": mismatches[:20]}))
failed = [name for name, bad in (("errors", errors), ("mismatches", mismatches), ("rss", peak > limit_kb)) if bad]
if failed:
    sys.exit(f"FAILED: {', '.join(failed)}")
