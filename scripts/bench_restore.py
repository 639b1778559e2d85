"""Restoring saved KV states vs re-prefilling them.

For prompts of 1k, 4k and 8k tokens (standard-library code), on gemma3-270m
and on the default model, it measures the time to first token when the
prompt's KV comes from: nothing (re-prefill), the RAM tier, the disk tier
(page cache dropped for the file), and after a process restart.

    python scripts/bench_restore.py                   # both models
    python scripts/bench_restore.py --models default  # quick
"""

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from efim_local import benchutil as bu
from efim_local.backend import ContextParams
from efim_local.config import Config
from efim_local.engine import CompletionRequest, Engine
from efim_local.store import StoreConfig
from efim_local.tinymodel import stdlib_files

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--models", default="gemma,default")
ap.add_argument("--sizes", default="1024,4096,8192")
ap.add_argument("--repeat", type=int, default=3, help="restores per tier (the median is reported)")
args = ap.parse_args()
sizes = [int(s) for s in args.sizes.split(",")]

corpus = "".join(p.read_text("utf-8", errors="replace") for p in stdlib_files(2_000_000))


def evict_page_cache(d: Path) -> None:
    """Make the next read of the state files come from the disk, not the page cache."""
    for p in (d / "states").glob("*.kv"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def ttft(engine: Engine, tokens, expect: str | None = None) -> float:
    out = engine.run(tokens, CompletionRequest("", 0, max_tokens=1), path="bench.py")
    if expect and out.cache_tier != expect:
        raise SystemExit(f"expected a {expect} hit, got {out.cache_tier}")
    return out.timings.prompt_ms


def drop_slot(engine: Engine) -> None:
    for s in engine.slots.slots:
        engine.ctx.seq_rm(s.seq, 0, -1)
        s.reset()


rows = []
for name in args.models.split(","):
    model, template = bu.bench_model(name)
    for n in tqdm(sizes, desc=name):
        cfg = Config(model=str(model), fim_template=template,
                     context=ContextParams(n_ctx_seq=n + 256, n_slots=1, n_batch=512))
        d = Path(tempfile.mkdtemp(prefix="efim-bench-"))
        sc = StoreConfig(d, ram_mb=8192, disk_mb=16384, min_tokens=16)
        with Engine(cfg, model, store=sc) as e:
            tokens = e.model.tokenize(corpus)[:n]
            prefill = [ttft(e, tokens)]
            e.flush()  # now in the RAM tier
            ram = []
            for _ in range(args.repeat):
                drop_slot(e)
                ram.append(ttft(e, tokens, "ram"))
                # A cold reference with the store out of the way, for a second prefill sample.
            e.store.spill()  # now on disk
            disk = []
            for _ in range(args.repeat):
                drop_slot(e)
                evict_page_cache(d)
                disk.append(ttft(e, tokens, "disk"))
            store, e.store = e.store, None
            for _ in range(args.repeat - 1):
                drop_slot(e)
                prefill.append(ttft(e, tokens))
            e.store = store
            size = sum(p.stat().st_size for p in (d / "states").glob("*.kv"))
        # After a restart: a new process-like engine over the same store, warm vs cold.
        with Engine(cfg, model, store=sc) as e:
            evict_page_cache(d)
            warm = ttft(e, tokens, "disk")
        with Engine(cfg, model) as e:
            cold = ttft(e, tokens)
        shutil.rmtree(d)
        p, r, k = bu.pctl(prefill, 0.5), bu.pctl(ram, 0.5), bu.pctl(disk, 0.5)
        rows.append({"model": name, "tokens": n, "prefill_ms": p, "ram_ms": r, "disk_ms": k,
                     "prefill/ram": p / r, "prefill/disk": p / k, "bytes/token": size / n,
                     "restart_warm_ms": warm, "restart_cold_ms": cold})

cols = list(rows[0])
print(bu.table(rows, cols))
path = bu.save("restore-" + args.models.replace(",", "-"), {"args": vars(args), "rows": rows})
print(f"saved {path}")
