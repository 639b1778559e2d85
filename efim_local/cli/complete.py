"""`efim complete` and `efim status`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..document import decode, offset_of, read_source
from . import build_config, emit, fail, main, model_options, user_errors


@main.command()
@click.argument("path", type=click.Path(dir_okay=True))
@click.option("--line", "-l", type=click.IntRange(1), required=True, help="Cursor line, 1-based.")
@click.option("--column", "-c", type=click.IntRange(1), required=True, help="Cursor column, 1-based, in characters.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the document from standard input; PATH only names it.")
@click.option("--max-tokens", type=click.IntRange(1, 4096), help="Most tokens to generate.")
@click.option("--temperature", type=click.FloatRange(0, 5), default=0.0, show_default=True)
@click.option("--stop-at-newline", is_flag=True, help="Stop at the end of the first line.")
@click.option("--max-lines", type=click.IntRange(1, 1000), help="Stop after this many lines.")
@click.option("--heal", is_flag=True, help="Token healing: re-choose the partial word at the cursor.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the text.")
@click.option("--no-cache", is_flag=True, help="Neither restore nor save KV states.")
@click.option("--no-daemon", is_flag=True, help="Run in-process even if a daemon is running.")
@click.option("--start-daemon", is_flag=True, help="Start the daemon if it is not running, then use it.")
@model_options
@user_errors
def complete(path, line, column, from_stdin, max_tokens, temperature, stop_at_newline, max_lines, heal, as_json,
             no_cache, no_daemon, start_daemon, **model_kw):
    """Complete the code at a cursor position in PATH.

    \b
    Examples:
      efim complete app.py --line 3 --column 5
      cat app.py | efim complete app.py --stdin -l 3 -c 5 --json
    """
    from ..engine import CompletionRequest
    from ..api import open_engine

    text = decode(sys.stdin.buffer.read(), "standard input") if from_stdin else read_source(path)
    cursor = offset_of(text, line - 1, column - 1)
    key = str(Path(path).resolve()) if not from_stdin else path
    # Model options other than the layout describe another engine than the daemon's.
    own_model = any(v is not None for k, v in model_kw.items() if k != "layout")
    if not (no_daemon or no_cache or own_model):
        out = _complete_via_daemon(start_daemon, key, text, cursor, max_tokens, temperature, stop_at_newline,
                                   max_lines, model_kw.get("layout"), heal)
        if out is not None:
            return emit(out, as_json, out["text"] + "\n")
    cfg = build_config(**model_kw)
    if no_cache:
        cfg = cfg.with_overrides(store=False)
    with open_engine(cfg) as engine:
        out = engine.complete(CompletionRequest(
            text=text, cursor=cursor, path=key, max_tokens=max_tokens, temperature=temperature,
            stop_at_newline=stop_at_newline, max_lines=max_lines, heal=heal))
        emit(out.to_json(), as_json, out.text + "\n")
        sys.stdout.flush()  # the answer is out before the state is written (on close)


def _complete_via_daemon(start, path, text, cursor, max_tokens, temperature, stop_at_newline, max_lines, layout, heal):
    """The daemon's answer, or None when no daemon runs (and none was asked for)."""
    from ..daemon import client
    from ..daemon.protocol import RpcError

    if start and not client.running():
        from .daemon import start_daemon

        start_daemon(120.0, {})
    params = {"path": path, "text": text, "offset": cursor, "max_tokens": max_tokens, "temperature": temperature,
              "stop_at_newline": stop_at_newline, "max_lines": max_lines, "layout": layout, "heal": heal}
    try:
        with client.Client(timeout=300) as c:
            return c.call("complete", {k: v for k, v in params.items() if v is not None})
    except client.DaemonUnavailable:
        return None
    except RpcError as e:
        fail(e.message)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@model_options
@user_errors
def status(as_json, **model_kw):
    """Show the model, backend library, layout, sliding-window strategy and KV store.

    \b
    Example:
      efim status --json
    """
    from ..api import open_engine
    from ..backend._lib import library_info

    cfg = build_config(**model_kw)
    with open_engine(cfg.with_overrides(store=False)) as engine:
        info = {
            "model": str(engine.model.path), "description": engine.model.description(),
            **library_info(), "layout": engine.default_layout,
            "fragment_trained": engine.fragment_trained, "template": engine.template.source,
            "slots": cfg.context.n_slots, "n_ctx_seq": cfg.context.n_ctx_seq,
            "sliding_window": engine.model.n_swa, "swa_strategy": engine.swa_strategy,
            "state_restore": "whole-state checkpoints" if engine.swa else "longest prefix",
            "sparse_restore": engine.sparse_status(),
            "store": str(cfg.store_config().dir) if cfg.store else None,
        }
    if as_json:
        emit(info, True)
    else:
        for k, v in info.items():
            click.echo(f"{k:18} {v}")
