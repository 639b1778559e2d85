"""`efim bench`: benchmarks, one subcommand per part (paced, replay, rounds, restore, context, quality,
all; and opening, user), each with a table, JSON and, where it has one, a chart. The others (cli,
drafts, infinigen, instant, load, lsp, nvim, overhead, speed, subtoken, team) are in bench_more.py.

The parts run through efim_local/bench/suite.py, as `efim bench --only PART` did; that old form (and
`efim bench --quick`) still works: a first argument that is an option goes to the hidden `legacy`
command, the former `efim bench` with all its options.
"""

from __future__ import annotations

from pathlib import Path

import click

from . import emit, main, user_errors

PARTS = ("paced", "replay", "rounds", "restore", "context", "quality")  # (the suite's; `opening` runs alone)


# Every option once; each subcommand takes the ones its part reads (``_options``).
OPTIONS = {
    "quick": click.option("--quick", is_flag=True, help="A short run (fewer requests, files or sizes)."),
    "model": click.option("--model", "-m", default="gemma", show_default=True,
                          help="'gemma' (gemma3-270m, FIM tokens marked for /infill), 'gemma-text' (gemma3-270m "
                               "with text markers), 'qwen0.5b' or 'qwen1.5b' (Qwen2.5-Coder Instruct: `make qwen`), "
                               "'default', or a GGUF path."),
    "server": click.option("--server", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           help="llama-server binary (default: native/build/server/bin/llama-server, `make server`)."),
    "requests": click.option("--requests", "max_requests", type=click.IntRange(1, 100000),
                             help="Edit-trace requests per backend (default: 40 quick, 200 full)."),
    "threads": click.option("--threads", type=click.IntRange(0, 1024), default=0, help="CPU threads (0: all)."),
    "out": click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
                        show_default=True, help="Where the JSON and PNG go."),
    "max_prompt_ms": click.option("--max-prompt-ms", type=click.FloatRange(0, 600_000), default=None,
                                  help="efim's latency budget (0: off; default: the config's, 300 ms)."),
    "busy": click.option("--busy", is_flag=True, help="With one core kept busy by another process."),
    "n_ctx": click.option("--n-ctx", type=click.IntRange(256, 1 << 20), default=None,
                          help="Tokens per slot (efim) and of llama-server's context."),
    "trace": click.option("--trace", "trace_name", default=None, metavar="NAME|PATH",
                          help="The edit trace: 'efim' (this project's history, the default), 'click' (click "
                               "8.1.x releases, files of 3-10k tokens), or a trace file (scripts/make_trace.py)."),
    "backend": click.option("--backend", default=None, metavar="URL[,URL]|local:N",
                            help="Through efim with these llama-server replicas (local:N: N started here), "
                                 "against efim in-process (docs/team.md)."),
    "kill_replica": click.option("--kill-replica", is_flag=True, help="With --backend local:N: kill one replica "
                                                                      "halfway."),
    "repo": click.option("--repo-context", "repo", type=click.Path(file_okay=False, exists=True, path_type=Path),
                         default=None, metavar="DIR",
                         help="With repository context on: the trace's files are taken as paths under DIR, a git "
                              "work tree of the trace's project (docs/repo-context.md)."),
    "infill": click.option("--set", "infill", type=click.Choice(["single", "multi", "span-light", "span"]),
                           default="single", show_default=True, help="The HumanEval-infilling set."),
    "protocol": click.option("--protocol", type=click.Choice(["typed", "paper"]), default="typed", show_default=True,
                             help="The user typed part of the hole, or the EFIM paper's split."),
    "files": click.option("--files", type=click.IntRange(1, 1000), default=None,
                          help="Standard-library files (default: 1 quick, 4)."),
    "rounds": click.option("--rounds", type=click.IntRange(1, 1000), default=None,
                           help="Rounds per file (default: 3 quick, 5)."),
    "max_tokens": click.option("--max-tokens", type=click.IntRange(1, 100000), default=None,
                               help="Tokens generated per round (default: 32 quick, 128)."),
    "sizes": click.option("--sizes", default=None, metavar="N[,N...]",
                          help="Prompt sizes in tokens (default: 2048 quick, 1024,4096,8192)."),
    "repeat": click.option("--repeat", type=click.IntRange(1, 1000), default=None,
                           help="Restores per tier, the median reported (default: 1 quick, 3)."),
    "as_json": click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables."),
}


def _options(*names: str, **override):
    """The decorators of ``OPTIONS[name]`` for each name (``override``: a name's own option here)."""

    def deco(fn):
        for n in reversed(names):
            fn = (override.get(n) or OPTIONS[n])(fn)
        return fn

    return deco


class BenchGroup(click.Group):
    """`efim bench PART ...`; an option first (`efim bench --quick`, `efim bench --only paced ...`) is
    the former single command, kept as the hidden `legacy` subcommand."""

    def parse_args(self, ctx, args):
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            args = ["legacy", *args]
        return super().parse_args(ctx, args)


@main.group(cls=BenchGroup)
def bench():
    """Benchmarks: real edits replayed through efim and llama-server, the EFIM paper's rounds, state
    restores, context and answer quality; and the daemon's latency and load, the editors' first
    ghost, drafts, sparse restores, speed per model size, sub-token scores, many users on one server.
    One subcommand per benchmark (`efim bench NAME --help`); each prints its tables (--json: JSON
    instead) and most save a JSON in --out. `efim bench --only PART ...` and `efim bench --quick`
    still work (the former form).

    \b
    Examples:
      make server && efim bench all --quick
      efim bench paced --model default --trace click --requests 200 --n-ctx 4096
      efim bench quality --model qwen0.5b --set multi --requests 300
      efim bench overhead --model default --json
    """


def _check(trace_name: str | None = None, backend: str | None = None) -> None:
    from ..bench import trace

    try:
        trace.resolve(trace_name)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--trace") from None
    if backend is not None:
        from ..config import check_url
        from ..errors import ConfigError

        try:
            _ = int(backend[6:]) if backend.startswith("local:") else [check_url(u) for u in backend.split(",")]
        except (ValueError, ConfigError) as e:
            raise click.BadParameter(str(e), param_hint="--backend") from None


def _run(parts: tuple[str, ...], as_json: bool, **kw) -> None:
    """Run ``parts`` through the suite with ``kw`` (SuiteConfig fields; None: the part's default)."""
    from ..bench import peers, suite

    _check(kw.get("trace"), kw.get("backend"))
    kw["server"] = kw.get("server") or peers.SERVER_BIN
    cfg = suite.SuiteConfig(parts=parts, **kw)
    res = suite.run(cfg, log=(lambda s: None) if as_json else click.echo)
    if as_json:
        drop = ("rows", "full_tokens")
        emit({k: ({kk: vv for kk, vv in v.items() if kk not in drop} if k in ("replay", "paced", "context") else v)
              for k, v in res.items()}, True)
    else:
        pngs = [res[k] for k in ("png", "paced_png") if res.get(k)]
        click.echo(f"saved {res['json']}" + (f" and {', '.join(pngs)}" if pngs else ""))


@bench.command()
@_options("quick", "model", "requests", "threads", "max_prompt_ms", "busy", "server", "trace", "n_ctx", "backend",
          "kill_replica", "repo", "out", "as_json",
          n_ctx=click.option("--n-ctx", type=click.IntRange(256, 1 << 20), default=None,
                             help="Tokens per slot (efim) and of llama-server's context (default: 8192)."))
@user_errors
def paced(quick, model, max_requests, threads, max_prompt_ms, busy, server, trace_name, n_ctx, backend,
          kill_replica, repo, out, as_json):
    """The edit trace typed at human speed through an efim daemon and llama-server (/infill): time to
    first token, stale answers and the share of the full plan each answer used (docs/benchmarks.md).

    \b
    Examples:
      efim bench paced --model default --requests 40 --server /nonexistent
      efim bench paced --trace click --requests 500 --n-ctx 4096 --busy
      efim bench paced --model default --requests 120 --threads 1 --backend local:2 --kill-replica
    """
    _run(("paced",), as_json, quick=quick, model=model, max_requests=max_requests, threads=threads,
         max_prompt_ms=max_prompt_ms, busy=busy, server=server, trace=trace_name, n_ctx=n_ctx, backend=backend,
         kill_replica=kill_replica, repo=repo, out=out)


@bench.command()
@_options("quick", "model", "requests", "threads", "server", "trace", "out", "as_json",
          requests=click.option("--requests", "max_requests", type=click.IntRange(1, 100000),
                                help="Edit-trace requests per backend (default: 12 quick, 200 full)."))
@user_errors
def replay(quick, model, max_requests, threads, server, trace_name, out, as_json):
    """The edit trace replayed back to back through efim daemons (EFIM, FIM) and llama-server
    (/infill, /completion): time to first token and prompt tokens evaluated per request.

    \b
    Examples:
      efim bench replay --model default --requests 50 --json
      efim bench replay --quick --trace click
    """
    _run(("replay",), as_json, quick=quick, model=model, max_requests=max_requests, threads=threads, server=server,
         trace=trace_name, out=out)


@bench.command()
@_options("quick", "model", "files", "rounds", "max_tokens", "threads", "out", "as_json")
@user_errors
def rounds(quick, model, files, rounds, max_tokens, threads, out, as_json):
    """The EFIM paper's multi-round protocol, EFIM against FIM (both with prefix reuse): the middle
    grows one chunk per round on standard-library files of 2-4k tokens.

    \b
    Examples:
      efim bench rounds --model gemma-text        # docs/benchmarks.md's table
      efim bench rounds --model default --quick
    """
    _run(("rounds",), as_json, quick=quick, model=model, rounds_files=files, rounds_rounds=rounds,
         rounds_max_tokens=max_tokens, threads=threads, out=out)


@bench.command()
@_options("quick", "model", "sizes", "repeat", "out", "as_json")
@user_errors
def restore(quick, model, sizes, repeat, out, as_json):
    """Time to first token for a prompt whose KV comes from nothing (re-prefill), the RAM tier, the
    disk tier and after a restart.

    \b
    Examples:
      efim bench restore --model gemma-text
      efim bench restore --model default --sizes 1024,4096 --repeat 1
    """
    try:
        sz = tuple(int(s) for s in sizes.split(",")) if sizes else None
    except ValueError:
        raise click.BadParameter(f"{sizes!r} is not a list of token counts", param_hint="--sizes") from None
    _run(("restore",), as_json, quick=quick, model=model, restore_sizes=sz, restore_repeat=repeat, out=out)


@bench.command()
@_options("quick", "model", "requests", "threads", "max_prompt_ms", "busy", "trace", "n_ctx", "out", "as_json",
          n_ctx=click.option("--n-ctx", type=click.IntRange(256, 1 << 20), default=None,
                             help="Tokens per slot (default: 4096, the daemon's default)."))
@user_errors
def context(quick, model, max_requests, threads, max_prompt_ms, busy, trace_name, n_ctx, out, as_json):
    """A paced replay, then what the user typed next scored by gemma3-270m after efim's plans, the
    full plans and llama.vim's window (docs/benchmarks-context.md).

    \b
    Examples:
      efim bench context --trace click --requests 500 --n-ctx 4096 --model qwen2.5-coder-0.5b-random-q8_0.gguf
      efim bench context --quick --model default
    """
    _run(("context",), as_json, quick=quick, model=model, max_requests=max_requests, threads=threads,
         max_prompt_ms=max_prompt_ms, busy=busy, trace=trace_name, n_ctx=n_ctx, out=out)


@bench.command()
@_options("quick", "model", "infill", "protocol", "requests", "threads", "out", "as_json",
          requests=click.option("--requests", "max_requests", type=click.IntRange(1, 100000),
                                help="Tasks (default: 40 quick, all)."))
@user_errors
def quality(quick, model, infill, protocol, max_requests, threads, out, as_json):
    """HumanEval infilling answers per layout: exact match, pass@1 and paired intervals
    (docs/models.md).

    \b
    Examples:
      efim bench quality --model qwen0.5b
      efim bench quality --model qwen1.5b --set multi --requests 300 --protocol paper
    """
    _run(("quality",), as_json, quick=quick, model=model, infill=infill, protocol=protocol,
         max_requests=max_requests, threads=threads, out=out)


@bench.command()
@_options("model", "threads", "n_ctx", "out", "as_json")
@click.option("--files", type=click.IntRange(1, 100), default=4, show_default=True,
              help="Files per trace (efim and click).")
@click.option("--tokens", default="3000,10000", show_default=True, metavar="LO,HI",
              help="The files' sizes in tokens.")
@click.option("--waits", default="0.5,1,2", show_default=True, metavar="S[,S...]",
              help="Seconds from the open to the first request.")
@click.option("--condition", "conditions", type=click.Choice(["new", "seen"]), multiple=True,
              help="new: a file never seen; seen: one the store holds from an earlier day (default: both).")
@user_errors
def opening(model, threads, n_ctx, out, as_json, files, tokens, waits, conditions):
    """The first request after a file is opened: the share of the full plan it was computed from, its
    time, and whether its ghost matched what the commit typed there (efim_local/bench/opening.py).

    \b
    Examples:
      efim bench opening --model qwen0.5b
      efim bench opening --model qwen0.5b --files 2 --waits 2 --condition new
    """
    from ..bench import opening as op
    from ..bench import suite

    try:
        ws = tuple(float(w) for w in waits.split(","))
    except ValueError:
        raise click.BadParameter("seconds, comma-separated (0.5,1,2)", param_hint="--waits") from None
    if any(not 0 <= w <= 600 for w in ws):
        raise click.BadParameter("each wait is 0-600 s", param_hint="--waits")
    try:
        lo, hi = (int(n) for n in tokens.split(","))
    except ValueError:
        raise click.BadParameter("two numbers, LO,HI (3000,10000)", param_hint="--tokens") from None
    path, _ = suite.bench_model(model)
    cfg = op.OpeningConfig(path, files=files, waits=ws, conditions=tuple(conditions) or ("new", "seen"),
                           threads=threads, n_ctx=n_ctx or 4096, tokens=(lo, hi), out=out)
    res = op.run(cfg, log=None if as_json else click.echo)
    if as_json:
        emit({k: v for k, v in res.items() if k != "rows"}, True)
    else:
        click.echo(f"saved {res['json']}")


@bench.command("all")
@_options("quick", "model", "requests", "threads", "max_prompt_ms", "busy", "server", "trace", "n_ctx", "backend",
          "kill_replica", "repo", "out", "as_json",
          quick=click.option("--quick", is_flag=True, help="A short run (about 3 minutes on 2 cores)."),
          requests=click.option("--requests", "max_requests", type=click.IntRange(1, 100000),
                                help="Edit-trace requests per backend (default: 40 paced and 12 replay quick, 200)."),
          n_ctx=click.option("--n-ctx", type=click.IntRange(256, 1 << 20), default=None,
                             help="Tokens per slot (efim) and of llama-server's context in the paced part "
                                  "(default: 8192)."))
@user_errors
def all_parts(quick, model, max_requests, threads, max_prompt_ms, busy, server, trace_name, n_ctx, backend,
              kill_replica, repo, out, as_json):
    """paced, replay, rounds and restore in one run on one model, with one JSON and two charts
    (what `make bench` and `make bench-quick` run).

    \b
    Examples:
      make server && efim bench all --quick
      efim bench all --model default
    """
    from ..bench import suite

    _run(suite.PARTS, as_json, quick=quick, model=model, max_requests=max_requests, threads=threads,
         max_prompt_ms=max_prompt_ms, busy=busy, server=server, trace=trace_name, n_ctx=n_ctx, backend=backend,
         kill_replica=kill_replica, repo=repo, out=out)


@bench.command(hidden=True)
@click.option("--only", type=click.Choice(PARTS), multiple=True)
@_options("quick", "model", "infill", "protocol", "server", "requests", "threads", "out", "max_prompt_ms", "busy",
          "n_ctx", "trace", "backend", "kill_replica", "repo", "as_json")
@user_errors
def legacy(only, quick, model, infill, protocol, server, max_requests, threads, out, max_prompt_ms, busy, n_ctx,
           trace_name, backend, kill_replica, repo, as_json):
    """The former `efim bench [--only PART]... [options]`: every option, for any part."""
    from ..bench import suite

    _run(tuple(only) or suite.PARTS, as_json, quick=quick, model=model, infill=infill, protocol=protocol,
         server=server, max_requests=max_requests, threads=threads, out=out, max_prompt_ms=max_prompt_ms,
         busy=busy, n_ctx=n_ctx, trace=trace_name, backend=backend, kill_replica=kill_replica, repo=repo)


@bench.command()
@_options("model", "trace", "requests", "max_tokens", "threads", "max_prompt_ms",
          trace=click.option("--trace", "trace_name", default="click", show_default=True, metavar="NAME|PATH",
                             help="The edit trace: 'efim', 'click' or a trace file (scripts/make_trace.py)."),
          requests=click.option("--requests", "max_requests", type=click.IntRange(1, 100000), default=100,
                                show_default=True, help="Requests of the trace replayed."),
          max_tokens=click.option("--max-tokens", type=click.IntRange(1, 100000), default=32, show_default=True,
                                  help="Tokens per suggestion."),
          threads=click.option("--threads", type=click.IntRange(0, 1024), default=2, show_default=True,
                               help="CPU threads (0: all)."))
@click.option("--patient", type=click.FloatRange(0, 3600), default=0.0, show_default=True,
              help="Wait up to this many seconds for each suggestion (a loaded machine); 0: the trace's pace.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report (JSON, with each accept's detail) to this file.")
@user_errors
def user(model, trace_name, max_requests, max_tokens, threads, max_prompt_ms, patient, out):
    """A simulated user in the paced replay (efim_local/bench/user.py): accepts, type-through keystrokes
    and the time to the next suggestion after an accept; prints the report as JSON.

    \b
    Examples:
      nice -n 19 efim bench user --requests 60                 # the click trace, at its pace
      nice -n 19 efim bench user --requests 60 --patient 30    # waits for each suggestion
    """
    import json
    import os

    from ..bench import paced, suite
    from ..bench import trace as tr
    from ..bench.user import run_user

    _check(trace_name)
    path, _ = suite.bench_model(model)
    cfg = paced.PacedConfig(path, max_requests=max_requests, max_tokens=max_tokens, threads=threads,
                            trace=trace_name, n_ctx=4096, max_prompt_ms=max_prompt_ms)
    res = run_user(cfg, paced.steps(tr.load(tr.resolve(trace_name)), cfg.pacing), patient)
    res["load_avg"] = os.getloadavg()
    click.echo(json.dumps({k: v for k, v in res.items() if k != "accepts_detail"}, indent=2))
    if out:
        out.write_text(json.dumps(res, indent=2))
