"""`efim bench`: benchmarks against llama-server, with a table, JSON and a chart."""

from __future__ import annotations

from pathlib import Path

import click

from . import emit, main, user_errors


@main.command()
@click.option("--quick", is_flag=True, help="A short run (about 3 minutes on 2 cores).")
@click.option("--model", "-m", default="gemma", show_default=True,
              help="'gemma' (gemma3-270m, FIM tokens marked for /infill), 'qwen0.5b' or 'qwen1.5b' "
              "(Qwen2.5-Coder Instruct: `make qwen`), 'default', or a GGUF path.")
@click.option("--only", type=click.Choice(["paced", "replay", "rounds", "restore", "context", "quality"]),
              multiple=True,
              help="Run only these parts (repeatable). 'context' (not run by default): a paced replay, then "
                   "what the user typed next scored by gemma3-270m after efim's plans, the full plans and "
                   "llama.vim's window. 'quality' (not run by default): HumanEval infilling answers per "
                   "layout (exact match, pass@1, paired intervals; --set, --protocol).")
@click.option("--set", "infill", type=click.Choice(["single", "multi", "span-light", "span"]), default="single",
              show_default=True, help="The quality part's HumanEval-infilling set.")
@click.option("--protocol", type=click.Choice(["typed", "paper"]), default="typed", show_default=True,
              help="The quality part's protocol: the user typed part of the hole, or the EFIM paper's split.")
@click.option("--server", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="llama-server binary (default: native/build/server/bin/llama-server, `make server`).")
@click.option("--requests", "max_requests", type=click.IntRange(1, 100000),
              help="Edit-trace requests per backend (default: 12 quick, 200 full); the quality part's "
                   "tasks (default: 40 quick, all).")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, help="CPU threads (0: all).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Where the JSON and PNG go.")
@click.option("--max-prompt-ms", type=click.FloatRange(0, 600_000), default=None,
              help="efim's latency budget in the paced replays (0: off; default: the config's, 300 ms).")
@click.option("--busy", is_flag=True,
              help="The paced replays (paced, context) with one core kept busy by another process.")
@click.option("--n-ctx", type=click.IntRange(256, 1 << 20), default=None,
              help="Tokens per slot (efim) and of llama-server's context in the paced and context parts "
                   "(default: 8192 paced, 4096 context, the daemon's default).")
@click.option("--trace", "trace_name", default=None, metavar="NAME|PATH",
              help="The edit trace: 'efim' (this project's history, the default), 'click' (click 8.1.x "
                   "releases, files of 3-10k tokens), or a trace file (scripts/make_trace.py).")
@click.option("--backend", default=None, metavar="URL[,URL]|local:N",
              help="The paced part through efim with these llama-server replicas (local:N: N started here), "
                   "against efim in-process (docs/team.md).")
@click.option("--kill-replica", is_flag=True, help="With --backend local:N: kill one replica halfway.")
@click.option("--repo-context", "repo", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              metavar="DIR", help="The paced part with repository context on: the trace's files are taken as "
                                  "paths under DIR, a git work tree of the trace's project (docs/repo-context.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables.")
@user_errors
def bench(quick, model, only, server, max_requests, threads, max_prompt_ms, busy, n_ctx, trace_name, out,
          backend, kill_replica, repo, infill, protocol, as_json):
    """Replay real edits through efim (EFIM, FIM) and llama-server (/infill, /completion), then
    the EFIM paper's rounds and the state-restore benchmark, all on one model.

    \b
    Examples:
      make server && efim bench --quick
      efim bench --model default --only replay --json
      efim bench --model qwen.gguf --only quality --set single --requests 300
    """
    from ..bench import peers, suite, trace

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
    cfg = suite.SuiteConfig(model=model, quick=quick, parts=tuple(only) or suite.PARTS,
                            server=server or peers.SERVER_BIN, threads=threads, out=out,
                            max_requests=max_requests, max_prompt_ms=max_prompt_ms, busy=busy,
                            trace=trace_name, n_ctx=n_ctx, backend=backend, kill_replica=kill_replica, repo=repo,
                            infill=infill, protocol=protocol)
    res = suite.run(cfg, log=(lambda s: None) if as_json else click.echo)
    if as_json:
        drop = ("rows", "full_tokens")
        emit({k: ({kk: vv for kk, vv in v.items() if kk not in drop} if k in ("replay", "paced", "context") else v)
              for k, v in res.items()}, True)
    else:
        pngs = [res[k] for k in ("png", "paced_png") if res.get(k)]
        click.echo(f"saved {res['json']}" + (f" and {', '.join(pngs)}" if pngs else ""))
