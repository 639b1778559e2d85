"""Restoring saved KV states vs re-prefilling them.

For prompts of n tokens of standard-library code, the time to first token when the prompt's KV
comes from: nothing (re-prefill), the RAM tier, the disk tier (page cache dropped for the file),
and after a process restart (a new engine over the same store).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from . import util as bu
from ..llama import ContextParams
from ..config import Config
from ..engine.engine import Engine
from ..request import Options
from ..kv import StoreConfig
from ..training.corpus import stdlib_files


def evict_page_cache(d: Path) -> None:
    """Make the next read of the state files come from the disk, not the page cache."""
    for p in (d / "states").glob("*.kv"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _ttft(engine: Engine, tokens, expect: str | None = None, cold: bool = False) -> float:
    out = engine.run(tokens, Options(max_tokens=1), path="bench.py", cold=cold)
    if expect and out.cache_tier != expect:
        raise RuntimeError(f"expected a {expect} hit, got {out.cache_tier}")
    return out.timings.prompt_ms


def run(name: str, model: Path, template: str | None, sizes: list[int], repeat: int = 3) -> list[dict]:
    """One row per prompt size; medians of ``repeat`` samples."""
    corpus = "".join(p.read_text("utf-8", errors="replace") for p in stdlib_files(2_000_000))
    rows = []
    for n in tqdm(sizes, desc=f"restore {name}", leave=False):
        cfg = Config(model=str(model), fim_template=template,
                     context=ContextParams(n_ctx_seq=n + 256, n_slots=1, n_batch=512))
        d = Path(tempfile.mkdtemp(prefix="efim-bench-"))
        sc = StoreConfig(d, ram_mb=8192, disk_mb=16384, min_tokens=16)
        try:
            with Engine(cfg, model, store=sc) as e:
                tokens = e.model.tokenize(corpus)[:n]
                prefill = [_ttft(e, tokens)]
                e.flush()  # now in the RAM tier
                ram = []
                for _ in range(repeat):
                    e.clear_slots()
                    ram.append(_ttft(e, tokens, "ram"))
                e.store.spill()  # now on disk
                disk = []
                for _ in range(repeat):
                    e.clear_slots()
                    evict_page_cache(d)
                    disk.append(_ttft(e, tokens, "disk"))
                for _ in range(repeat - 1):  # more prefill samples, ignoring every cached state
                    prefill.append(_ttft(e, tokens, cold=True))
                size = sum(p.stat().st_size for p in (d / "states").glob("*.kv"))
            with Engine(cfg, model, store=sc) as e:
                evict_page_cache(d)
                warm = _ttft(e, tokens, "disk")
            with Engine(cfg, model) as e:
                cold = _ttft(e, tokens)
        finally:
            shutil.rmtree(d)
        p, r, k = bu.pctl(prefill, 0.5), bu.pctl(ram, 0.5), bu.pctl(disk, 0.5)
        rows.append({"model": name, "tokens": n, "prefill_ms": p, "ram_ms": r, "disk_ms": k,
                     "prefill/ram": p / r, "prefill/disk": p / k, "bytes/token": size / n,
                     "restart_warm_ms": warm, "restart_cold_ms": cold})
    return rows
