"""First suggestion in a newly opened file, through the Neovim plugin (editors/nvim; `efim bench nvim`).

A real daemon and a real headless Neovim with the plugin, driven over Neovim's RPC. For 2 x ``files``
standard-library files (different files: nothing cached from the one before), Neovim opens the file,
puts the cursor two thirds down, and types one character. Measured from the key (the plugin's
extmarks polled over RPC): the first streamed text on screen (``first_text_ms``) and the whole ghost
with the plugin's info line (``ghost_ms``; the info gives the daemon's time, prompt tokens evaluated
and cache tier). Files alternate between two ways:

- ``typed at once``: the key right after ``:edit`` (what the daemon's idle prefill managed by then),
- ``after a pause``: the key after the cursor rested on the line and the daemon went idle (the
  plugin's ``didOpen`` and ``cursor`` notifications prefilled the file and the plan there).

The plugin's debounce is set to 0 here: add ``debounce_ms`` (150 by default) for what a user waits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu

PLUGIN = Path(__file__).resolve().parents[2] / "editors" / "nvim"
# The plugin's info line (editors/nvim/lua/efim/init.lua, info_text): time, context share, evaluated, tier.
INFO = re.compile(r"efim (\d+) ms(?:, context \d+/\d+ \([^)]*\))?, (\d+) evaluated, ([\w-]+)")
MODES = ("typed at once", "after a pause")


@dataclass
class NvimConfig:
    model: str = "default"
    files: int = 5
    min_chars: int = 40_000  # smallest file to use
    max_tokens: int = 16
    nvim: str | None = None  # the Neovim binary (None: nvim on PATH)
    out: Path = bu.RESULTS


def idle(c, timeout=120.0) -> None:
    deadline = time.monotonic() + timeout
    while c.call("status")["idle_tasks"] and time.monotonic() < deadline:
        time.sleep(0.05)


def first_ghost(nv, path: Path, pause: bool, c) -> dict:
    nv.command("stopinsert")
    nv.command(f"edit {path}")
    n = len(nv.current.buffer)
    row = 2 * n // 3
    nv.current.window.cursor = (row, 0)
    if pause:
        nv.command("doautocmd CursorMoved")  # (headless Neovim fires no cursor events by itself)
        time.sleep(0.3)
        idle(c)
    nv.input("A")
    t0 = time.perf_counter()
    nv.input("x")
    deadline, first, info = t0 + 120, None, None
    while info is None and time.perf_counter() < deadline:  # the info line comes with the reply
        marks = nv.exec_lua('return vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_get_namespaces()["efim"], 0, -1,'
                            ' {details = true})')
        if marks and first is None:
            first = (time.perf_counter() - t0) * 1000
        chunks = [ch[0] for m in marks for line in [m[3]["virt_text"], *m[3].get("virt_lines", [])] for ch in line]
        info = next((INFO.search(ch) for ch in chunks if INFO.search(ch)), None)
        time.sleep(0.003)
    wall = (time.perf_counter() - t0) * 1000
    nv.input("<Esc>")
    idle(c)
    num = lambda i: float(info.group(i)) if info else float("nan")  # noqa: E731
    return {"file": path.name, "lines": n, "mode": MODES[pause],
            "first_text_ms": first if first is not None else float("nan"), "ghost_ms": wall,
            "daemon_ms": num(1), "evaluated": int(num(2)) if info else -1, "tier": info.group(3) if info else "?"}


def run(cfg: NvimConfig, log=print) -> dict:
    from ..daemon.client import Client
    from ..training.corpus import stdlib_files

    binary = cfg.nvim or shutil.which("nvim")
    if not binary:
        raise SystemExit("nvim not found (apt-get install neovim)")
    try:
        import pynvim
    except ImportError:
        raise SystemExit("pynvim missing: pip install pynvim (the test extras install it)") from None

    proc, sock = bu.spawn_daemon(*bu.bench_model(cfg.model))
    files = [p for p in stdlib_files(limit_bytes=50_000_000) if p.stat().st_size >= cfg.min_chars][:2 * cfg.files]
    tmp = Path(tempfile.mkdtemp(prefix="efim-bench-nvim-"))
    listen = tmp / "nvim.sock"
    nv_proc = subprocess.Popen([binary, "--headless", "-u", "NONE", "-i", "NONE", "--listen", str(listen),
                                "--cmd", f"set rtp+={PLUGIN}"], cwd=tmp, env=dict(os.environ, EFIM_SOCKET=str(sock)),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    load_before = os.getloadavg()
    try:
        while not listen.exists():
            if nv_proc.poll() is not None:
                raise SystemExit(f"{binary} exited ({nv_proc.returncode})")
            time.sleep(0.02)
        nv = pynvim.attach("socket", path=str(listen))
        nv.command("filetype on")
        nv.exec_lua(f'require("efim").setup({{ debounce_ms = 0, max_tokens = {cfg.max_tokens}, info = true,'
                    ' cursor_debounce_ms = 100 })')
        with Client(sock, timeout=300) as c:
            for i, src in enumerate(tqdm(files, desc="nvim", disable=log is None)):
                copy = tmp / f"{i}_{src.name}"
                shutil.copy(src, copy)
                rows.append(first_ghost(nv, copy, pause=i % 2 == 1, c=c))
                if log is not None:
                    tqdm.write(bu.table(rows[-1:], list(rows[-1])))
    finally:  # Neovim and the daemon go, whatever happened
        nv_proc.terminate()
        nv_proc.wait(10)
        try:
            with Client(sock) as c:
                c.call("shutdown")
            proc.wait(30)
        except Exception:  # noqa: BLE001 - it is not answering: stop it
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    summary = []
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if not rs:
            continue
        col = lambda key, rs=rs: [r[key] for r in rs]  # noqa: E731
        summary.append({"mode": mode, "files": len(rs), "first_text_ms_p50": bu.pctl(col("first_text_ms"), 0.5),
                        "ghost_ms_p50": bu.pctl(col("ghost_ms"), 0.5), "ghost_ms_max": max(col("ghost_ms")),
                        "evaluated_p50": bu.pctl(col("evaluated"), 0.5), "tiers": ",".join(sorted(set(col("tier"))))})
    name = Path(cfg.model).stem if cfg.model not in ("default", "gemma") else cfg.model
    res = {"args": bu.options(cfg), "rows": rows, "summary": summary, "load_before": load_before}
    res["json"] = str(bu.save(f"nvim-first-ghost-{name}", res, cfg.out))
    if log is not None:
        log("")
        log(bu.table(rows, list(rows[0])))
        log("")
        log(bu.table(summary, list(summary[0])))
        log(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    return res
