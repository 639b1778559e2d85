"""What the model fingerprint (sha256 over the whole GGUF) costs at start-up, and what its cache saves.

Rows: the hash with the file in the page cache, the hash after the file was dropped from the page
cache (``posix_fadvise(DONTNEED)``: read from disk), a first start (``model_fingerprint`` with an
empty store: hash and cache it) and a restart (the same store: the cached value, no read). Medians
of ``--repeat`` runs; prints a table and saves bench-results/fingerprint-*.json.

    .venv/bin/python scripts/make_shape_models.py --only qwen2.5-coder-1.5b --out /tmp/models
    .venv/bin/python scripts/investigations/bench_fingerprint.py --model /tmp/models/qwen2.5-coder-1.5b-random-q8_0.gguf
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from efim_local.bench import util as bu
from efim_local.kv import fingerprint

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", required=True, type=Path)
ap.add_argument("--repeat", type=int, default=3)
args = ap.parse_args()
size_gb = args.model.stat().st_size / 1e9


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn, before=lambda: None) -> float:
    runs = []
    for _ in range(args.repeat):
        before()
        fingerprint._fingerprint.cache_clear()  # a new process has no in-memory cache
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs)


fingerprint.hash_file(args.model)  # into the page cache
rows = []
for name, fn, before in [
    ("hash, page cache warm", lambda: fingerprint.hash_file(args.model), lambda: None),
    ("hash, from disk", lambda: fingerprint.hash_file(args.model), lambda: drop_page_cache(args.model)),
]:
    ms = timed(fn, before)
    rows.append({"case": name, "ms": round(ms, 1), "ms/GB": round(ms / size_gb, 1)})
with tempfile.TemporaryDirectory() as d:
    ms = timed(lambda: fingerprint.model_fingerprint(args.model, Path(d)),
               lambda: (Path(d) / fingerprint.CACHE_FILE).unlink(missing_ok=True))
    rows.append({"case": "first start (hash + cache)", "ms": round(ms, 1), "ms/GB": round(ms / size_gb, 1)})
    ms = timed(lambda: fingerprint.model_fingerprint(args.model, Path(d)))
    rows.append({"case": "restart (cached)", "ms": round(ms, 2), "ms/GB": round(ms / size_gb, 2)})
print(f"{args.model.name}: {size_gb:.2f} GB, medians of {args.repeat}, load average {os.getloadavg()[0]:.1f}")
print(bu.table(rows, list(rows[0])))
print("saved", bu.save(f"fingerprint-{args.model.stem}", {"model": str(args.model), "size_gb": size_gb,
                                                           "load_average": os.getloadavg()[0], "rows": rows}))
