"""The EFIM paper's multi-user protocol against a remote server: FIM against EFIM token prompts.

``users`` concurrent users each edit one source file of 2-4k tokens for ``rounds`` rounds (the
protocol of ``rounds.py``: prefix = file[:c], suffix = file[H:], round r's typed text is
file[c : H/7*(r+2)]); every round asks for ``max_tokens`` tokens (EOS ignored, temperature 0.2,
top-p 0.95, top-k 20). A user sends its next round when its last answer is complete. Prompts are
planned here (efim's planner, the model's vocabulary only) and sent as token arrays through
``backend.Pool``: FIM puts the typed text in the prefix, so every round recomputes the suffix; EFIM
puts it after the middle marker, so the server's prompt cache serves the prefix and the suffix.

Reported per layout: throughput (requests/s and generated tokens/s over the wall time), mean and p95
latency (request to last token), mean time to the first token, and the prompt tokens the server
computed. `efim bench team` runs it (:func:`run`): without ``url`` it starts llama-server itself
(native/cached_server.sh builds one, or ``server``) with ``--parallel users`` on a loopback port, a
fresh one per layout (cold caches for both); with ``url`` it uses a server already running (its cache
is then warm for the second layout: restart it in between, or run one layout at a time).
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import util as bu
from ..backend import Pool, Sampling
from ..config import Config
from ..engine.engine import make_planner
from ..llama import Model
from ..prompt.planner import FileSession

CACHED_SERVER = Path(__file__).resolve().parents[2] / "native" / "cached_server.sh"


@dataclass
class TeamConfig:
    model: str = "default"  # its vocabulary plans the prompts
    users: int = 16
    rounds: int = 5
    max_tokens: int = 128
    threads: int = 0  # llama-server threads (0: its default)
    layout: str = "both"  # fim, efim or both
    url: str | None = None  # a running server (None: start llama-server here)
    server: Path | None = None  # the llama-server binary to start (None: native/cached_server.sh's)
    api: str = "llama-server"  # or "openai"
    server_model: str = "default"  # the model name an OpenAI-compatible server wants
    api_key: str | None = None
    out: Path = bu.RESULTS


def plans(model: Path, template: str | None, users: int, rounds: int, max_tokens: int, layout: str):
    """{user: [token prompt of each round]} for one layout (the same files for both)."""
    cfg = Config(model=str(model), fim_template=template, max_tokens=max_tokens, max_middle_tokens=8192)
    cfg = cfg.with_overrides(n_ctx_seq=4608)
    with Model(model, vocab_only=True) as m:
        _, planner = make_planner(m, cfg)
        sources = bu.pick_sources(m.tokenize, users, 2000, 4000)
        out = {}
        for name, text in sources:
            session, rows = FileSession(layout=layout), []
            H = len(text) // 2
            for r in range(rounds):
                end = int(H / 7 * (r + 2))
                rows.append(list(planner.plan(session, text[:end] + text[H:], end, layout, reserve=max_tokens).tokens))
            out[name] = rows
    return out


def run_layout(pool: Pool, prompts: dict[str, list[list[int]]], max_tokens: int, desc: str | None = None) -> dict:
    """Every user's rounds, users concurrently; per-request rows and the wall time (``desc``: a
    progress bar's)."""
    from tqdm import tqdm

    rows: list[dict] = []
    lock = threading.Lock()
    bar = tqdm(total=sum(map(len, prompts.values())), desc=desc, disable=desc is None, leave=False)

    def user(name: str, rounds: list[list[int]]) -> None:
        for r, tokens in enumerate(rounds):
            s = Sampling(n_predict=max_tokens, temperature=0.2, top_k=20, top_p=0.95, seed=r, ignore_eos=True)
            t0 = time.perf_counter()
            call, first, end = pool.start(tokens, s, name), None, None
            while end is None:
                call.wait(5.0)
                for kind, data in call.take():
                    if kind == "chunk" and first is None:
                        first = time.perf_counter()
                    elif kind in ("end", "error"):
                        end = data
            t1 = time.perf_counter()
            if not isinstance(end, dict):
                raise end
            with lock:
                rows.append({"user": name, "round": r, "prompt": len(tokens), "ttft_ms": ((first or t1) - t0) * 1e3,
                             "latency_ms": (t1 - t0) * 1e3, "evaluated": end.get("evaluated"),
                             "cached": end.get("cached"), "generated": end.get("generated") or 0})
                bar.update(1)

    wall = bu.run_threads([threading.Thread(target=user, args=item) for item in prompts.items()])
    bar.close()
    return {"wall_s": wall, "rows": rows}


def summary(layout: str, res: dict) -> dict:
    rows, wall = res["rows"], res["wall_s"]
    return {"layout": layout, "requests": len(rows), "wall_s": round(wall, 2),
            "req_per_s": len(rows) / wall, "gen_tok_per_s": sum(x["generated"] for x in rows) / wall,
            "latency_mean_ms": bu.mean([x["latency_ms"] for x in rows]),
            "latency_p95_ms": bu.pctl([x["latency_ms"] for x in rows], 0.95),
            "ttft_mean_ms": bu.mean([x["ttft_ms"] for x in rows]),
            "evaluated_mean": bu.mean([x["evaluated"] or 0 for x in rows])}


def run(cfg: TeamConfig, log=print) -> dict:
    """Each layout through one server (a fresh llama-server per layout without ``url``): the summary
    per layout, the raw rows, the JSON's path."""
    from .peers import LlamaServer

    model, template = bu.bench_model(cfg.model)
    with Model(model, vocab_only=True) as vocab:
        n_vocab = vocab.n_vocab  # the ids the server names are checked against it
    layouts = ("fim", "efim") if cfg.layout == "both" else (cfg.layout,)
    results, summaries = {}, []
    for layout in layouts:
        prompts = plans(model, template, cfg.users, cfg.rounds, cfg.max_tokens, layout)
        server = None
        if not cfg.url:
            binary = cfg.server or Path(subprocess.run(["bash", str(CACHED_SERVER)], capture_output=True, text=True,
                                                       check=True).stdout.split()[-1])
            server = LlamaServer(binary, model, 4608, cfg.threads, parallel=cfg.users)
        try:
            pool = Pool([cfg.url or server.url], cfg.api, cfg.api_key, cfg.server_model, read_timeout=3600,
                        n_vocab=n_vocab, timeout=3600)
            res = results[layout] = run_layout(pool, prompts, cfg.max_tokens, None if log is None else layout)
        finally:
            if server is not None:
                server.close()
        summaries.append(summary(layout, res))
        if log is not None:
            log(bu.table(summaries[-1:], list(summaries[-1])))
    out = {"model": str(model), "args": {**bu.options(cfg), "api_key": None}, "summary": summaries, "raw": results}
    out["json"] = str(bu.save(f"team-{Path(model).stem}", out, cfg.out))
    if log is not None:
        log(bu.table(summaries, list(summaries[0])))
        if len(summaries) == 2:
            f, e = summaries
            log(f"\nEFIM/FIM throughput: {e['req_per_s'] / f['req_per_s']:.2f}x; "
                f"mean latency EFIM/FIM: {e['latency_mean_ms'] / f['latency_mean_ms']:.2f}x")
    return out
