"""``efim bench``: the paper's rounds, state restores and the edit-trace replay in one run, on one
model, with a table, a JSON file and a PNG chart."""

from __future__ import annotations

import importlib.util

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from . import util as bu
from ..eval import quality
from . import context, paced, paced_remote, peers, replay, restore, rounds, trace

PARTS = ("paced", "replay", "rounds", "restore")  # what `efim bench all` runs
EXTRA_PARTS = ("context", "quality")  # only when asked for: a paced replay then scoring; HumanEval answers


@dataclass
class SuiteConfig:
    model: str = "gemma"  # 'gemma', 'gemma-text', 'qwen0.5b', 'qwen1.5b', 'default' or a GGUF path
    quick: bool = False
    parts: tuple[str, ...] = PARTS
    server: Path = peers.SERVER_BIN
    threads: int = 0
    out: Path = Path("bench-results")
    max_requests: int | None = None  # replay requests per backend (default: 12 quick, 200 full)
    max_prompt_ms: float | None = None  # efim's latency budget in paced replays (0: off; None: the config's)
    busy: bool = False  # the paced replay with one core kept busy by another process
    trace: str | None = None  # the edit trace, by name (trace.TRACES) or path; None: the default
    n_ctx: int | None = None  # tokens per slot in the paced and context parts; None: 8192 paced, 4096 context
    backend: str | None = None  # paced part through replicas: URLs, or "local:N" (started here); paced_remote.py
    kill_replica: bool = False  # and one of those started here killed halfway
    repo: Path | None = None  # the paced part with repository context: the trace's files under this git tree
    infill: str = "single"  # the quality part's HumanEval-infilling set (quality.SETS)
    protocol: str = "typed"  # and its protocol: typed, or the EFIM paper's
    rounds_files: int | None = None  # the rounds part's files, rounds and tokens per round (None: 1/3/32 quick,
    rounds_rounds: int | None = None  # else 4/5/128)
    rounds_max_tokens: int | None = None
    restore_sizes: tuple[int, ...] | None = None  # the restore part's prompt sizes (None: 2048 quick, else 1k/4k/8k)
    restore_repeat: int | None = None  # and restores per tier (None: 1 quick, else 3)


def bench_model(name: str) -> tuple[Path, str | None]:
    """The model every part runs; for gemma3-270m a copy with FIM tokens, so ``/infill`` works
    ('gemma-text': gemma3-270m itself, with text markers)."""
    if name == "gemma-text":
        return bu.bench_model("gemma")
    if name == "gemma":
        from ..config import cache_home
        from .fim_copy import with_fim_tokens

        dst = cache_home() / "gemma3-270m-q4_k_m-fim.gguf"
        dst.parent.mkdir(parents=True, exist_ok=True)
        return with_fim_tokens(bu.gemma_path(), dst), None
    return bu.bench_model(name)


def run(cfg: SuiteConfig, log=print) -> dict:
    model, template = bench_model(cfg.model)
    q = cfg.quick
    res: dict = {"model": str(model), "config": {k: str(v) for k, v in asdict(cfg).items()}}
    if "paced" in cfg.parts:
        pc = paced.PacedConfig(model, max_requests=cfg.max_requests or (40 if q else 200), threads=cfg.threads,
                               max_prompt_ms=cfg.max_prompt_ms, busy=cfg.busy, server=cfg.server,
                               trace=cfg.trace, n_ctx=cfg.n_ctx or 8192, repo=cfg.repo)
        res["paced"] = (paced.run(pc) if cfg.backend is None
                        else paced_remote.run_spec(pc, cfg.backend, cfg.kill_replica))
        log(_paced_table(res["paced"]))
    if "context" in cfg.parts:
        cc = context.ContextConfig(model, trace=cfg.trace, max_requests=cfg.max_requests or (40 if q else 200),
                                   threads=cfg.threads, scorer_threads=cfg.threads or os.cpu_count() or 1,
                                   max_prompt_ms=cfg.max_prompt_ms, busy=cfg.busy,
                                   n_boot=500 if q else 2000, n_ctx=cfg.n_ctx or 4096)
        res["context"] = context.run(cc)
        log(context.table(res["context"]))
    if "quality" in cfg.parts:
        qc = quality.QualityConfig(model, template, set=cfg.infill, protocol=cfg.protocol,
                                   tasks=cfg.max_requests or (40 if q else 0), threads=cfg.threads, out=cfg.out)
        res["quality"] = quality.run(qc, log=log)
    if "replay" in cfg.parts:
        rc = replay.ReplayConfig(model, max_requests=cfg.max_requests or (12 if q else 200),
                                 max_tokens=16 if q else 32, threads=cfg.threads, server=cfg.server,
                                 trace=trace.resolve(cfg.trace))
        res["replay"] = replay.run(rc)
        log(_replay_table(res["replay"]))
    if "rounds" in cfg.parts:
        res["rounds"] = rounds.run(model, template, files=cfg.rounds_files or (1 if q else 4),
                                   rounds=cfg.rounds_rounds or (3 if q else 5),
                                   max_tokens=cfg.rounds_max_tokens or (32 if q else 128), threads=cfg.threads)
        log(bu.table(res["rounds"]["summary"], list(res["rounds"]["summary"][0])))
        log(f"FIM/EFIM mean TTFT: {res['rounds']['ratio_ttft_mean']:.2f}x all rounds, "
            f"{res['rounds']['ratio_ttft_mean_later']:.2f}x after the first\n")
    if "restore" in cfg.parts:
        res["restore"] = restore.run(cfg.model, model, template,
                                     list(cfg.restore_sizes or ([2048] if q else [1024, 4096, 8192])),
                                     repeat=cfg.restore_repeat or (1 if q else 3))
        log(bu.table(res["restore"], list(res["restore"][0])) + "\n")
    named = cfg.model in ('gemma', 'gemma-text', 'default', *bu.REAL_MODELS)
    name = f"bench-{cfg.model if named else Path(cfg.model).stem}" + \
        ("-quick" if q else "") + (f"-{Path(cfg.trace).name.split('.')[0]}" if cfg.trace else "")
    cfg.out.mkdir(parents=True, exist_ok=True)
    res["json"] = str(bu.save(name, res, cfg.out))
    if importlib.util.find_spec("matplotlib") is None:  # the tables and the JSON are the results; charts optional
        if any(p in res for p in ("replay", "rounds", "paced")):
            log("no chart: it needs matplotlib (pip install -e '.[bench]')")
        return res
    if "replay" in res or "rounds" in res:
        res["png"] = str(chart(res, cfg.out / f"{name}.png"))
    if "paced" in res:
        res["paced_png"] = str(paced_chart(res["paced"], cfg.out / f"{name}-paced.png", Path(res["model"]).name))
    return res


def _budget(ms: float | None) -> str:
    return "the config's default" if ms is None else ("off" if ms == 0 else f"{ms:g} ms")


def _paced_table(r: dict) -> str:
    head = (f"Paced replay: {r['requests']} requests, {r['keystrokes']} keystrokes ({r['auto_pair_keys']} auto-pair), "
            f"{r['duration_s']:.0f} s of typing ({r.get('trace', 'efim')} trace); "
            f"latency budget {_budget(r['max_prompt_ms'])}"
            + ("; one core kept busy" if r["busy"] else ""))
    cols = [c for c in ("backend", "requests", "answered", "stale_frac", "useful_frac", "useful_shown_frac",
                        "evaluated_p50", "ttft_p50_ms",
                        "ttft_p95_ms", "ttft_p99_ms",
                        "derived_p50_ms", "derived_p95_ms", "text_after_prefill_p50_ms", "text_after_prefill_p95_ms",
                        "context_frac_mean", "context_frac_shown", "context_median_tokens_5s", "reduced_frac",
                        "ttft_p50_vs_infill", "ttft_p95_vs_infill", "lost", "ttft_p50_vs_inprocess",
                        "ttft_p95_vs_inprocess")
            if any(c in s for s in r["summary"])]
    lines = [head, bu.table(r["summary"], cols)]
    for s in r["summary"]:
        if "repo_requests" in s:
            lines.append(f"repository context: {s['repo_requests']} requests with it ({s['repo_share']:.0%}); "
                         f"mean tokens T0 {s['repo_t0_tokens_mean']:.0f}, T1 {s['repo_t1_tokens_mean']:.0f}, "
                         f"T2 {s['repo_t2_tokens_mean']:.0f}; requests that prefilled it again, by reason: "
                         f"{s['repo_lead_prefilled_again'] or 'none'}")
    return "\n".join([*lines, *[f"note: {n}" for n in r["notes"]]]) + "\n"


def paced_chart(r: dict, path: Path, model: str) -> Path:
    """Time to first token per request along the paced replay, and efim's context per answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for name, rows in r["rows"].items():
        pts = [(x["t"], x["ttft_ms"]) for x in rows if x["ttft_ms"] is not None]
        a1.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, label=name)
    a1.set_yscale("log")
    a1.set_ylabel("time to first token (ms, log)")
    a1.legend(fontsize=8)
    rows = r["rows"].get("efim", [])
    pts = [(x["t"], (x["context_prefix_tokens"] + x["context_suffix_tokens"]) / max(1, full))
           for x, full in zip(rows, r["full_tokens"]) if "context_prefix_tokens" in x]
    a2.plot([p[0] for p in pts], [min(1, p[1]) for p in pts], ".", ms=3, color="tab:green")
    a2.set_ylim(0, 1.05)
    a2.set_ylabel("efim context / full plan")
    a2.set_xlabel("seconds into the replay")
    busy = ", one core busy" if r["busy"] else ""
    fig.suptitle(f"Paced replay on {model}: budget {_budget(r['max_prompt_ms'])}{busy}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _replay_table(r: dict) -> str:
    lines = [f"Edit-trace replay: {r['requests']} requests per backend ({', '.join(r['files'])})",
             bu.table(r["summary"], list(r["summary"][0])) if r["summary"] else "(no backend ran)"]
    return "\n".join(lines + [f"note: {n}" for n in r["notes"]]) + "\n"


def chart(res: dict, path: Path) -> Path:
    """Bars of the replay's time to first token and tokens evaluated, and the rounds' TTFT."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("the chart needs matplotlib: pip install -e '.[bench]'") from None
    panels = [p for p in ("replay", "rounds") if p in res]
    fig, axes = plt.subplots(1, len(panels) + ("replay" in res), figsize=(5.5 * (len(panels) + 1), 4.2))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    if "replay" in res:
        s = res["replay"]["summary"]
        names = [x["backend"].replace("llama-server ", "server\n").replace("efim daemon ", "efim\n") for x in s]
        ax = axes.pop(0)
        xs = range(len(s))
        ax.bar([i - 0.2 for i in xs], [x["ttft_p50_ms"] for x in s], 0.4, label="p50")
        ax.bar([i + 0.2 for i in xs], [x["ttft_p95_ms"] for x in s], 0.4, label="p95")
        ax.set_yscale("log")
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("time to first token (ms, log)")
        ax.set_title(f"Edit-trace replay ({res['replay']['requests']} requests)")
        ax.legend()
        ax = axes.pop(0)
        ax.bar(list(xs), [x["evaluated_mean"] for x in s], color="tab:green")
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("prompt tokens evaluated per request")
        ax.set_title("Tokens computed per request")
    if "rounds" in res:
        s = res["rounds"]["summary"]
        ax = axes.pop(0)
        ax.bar([x["layout"].upper() for x in s], [x["ttft_mean_ms"] for x in s], color="tab:purple")
        ax.set_ylabel("mean time to first token (ms)")
        ax.set_title("EFIM paper rounds")
    fig.suptitle(f"efim bench: {Path(res['model']).name}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
