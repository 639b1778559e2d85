"""`efim complete` and `efim status`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..prompt.document import MAX_DOCUMENT_BYTES, decode, offset_of, read_source
from . import build_config, config_mod, emit, main, model_options, request_options, user_errors


@main.command()
@click.argument("path", type=click.Path(dir_okay=True))
@click.option("--line", "-l", type=click.IntRange(1), required=True, help="Cursor line, 1-based.")
@click.option("--column", "-c", type=click.IntRange(1), required=True, help="Cursor column, 1-based, in characters.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the document from standard input; PATH only names it.")
@request_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the text.")
@click.option("--no-cache", is_flag=True, help="Neither restore nor save KV states.")
@click.option("--no-daemon", is_flag=True, help="Run in-process even if a daemon is running.")
@click.option("--start-daemon", is_flag=True, help="Start the daemon if it is not running, then use it.")
@model_options
@user_errors
def complete(path, line, column, from_stdin, as_json, no_cache, no_daemon, start_daemon, **kw):
    """Complete the code at a cursor position in PATH.

    \b
    Examples:
      efim complete app.py --line 3 --column 5
      cat app.py | efim complete app.py --stdin -l 3 -c 5 --json
    """
    from ..engine.request import CompletionRequest

    req_names = {name for name, _, _ in CompletionRequest.options()}
    model_kw = {k: v for k, v in kw.items() if k not in req_names or k == "layout"}
    text = decode(sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1), "standard input") if from_stdin else read_source(path)
    cursor = offset_of(text, line - 1, column - 1)
    req = CompletionRequest(text=text, cursor=cursor, path=str(Path(path).resolve()) if not from_stdin else path,
                            **{k: v for k, v in kw.items() if k in req_names and v is not None})
    # Model options other than the layout describe another engine than the daemon's.
    own_model = any(v is not None for k, v in model_kw.items() if k != "layout")
    if not (no_daemon or no_cache or own_model):
        out = _complete_via_daemon(start_daemon, req)
        if out is not None:
            return emit(out, as_json, out["text"] + "\n")
    from ..api import open_engine

    cfg = build_config(**model_kw)
    if no_cache:
        cfg = cfg.with_overrides(store=False)
    with open_engine(cfg) as engine:
        out = engine.complete(req)
        emit(out.to_json(), as_json, out.text + "\n")
        sys.stdout.flush()  # the answer is out before the state is written (on close)


def _complete_via_daemon(start: bool, req) -> dict | None:
    """The daemon's answer, or None when no daemon runs (and none was asked for)."""
    from ..daemon import client
    from ..errors import DaemonUnavailable

    if start and not client.running():
        from .daemon import start_daemon

        start_daemon(120.0, config_mod.load())
    params = {"path": req.path, "text": req.text, "offset": req.cursor, **req.to_params()}
    try:
        with client.Client(timeout=300) as c:
            return c.call("complete", params)
    except DaemonUnavailable:
        return None


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

    cfg = build_config(**model_kw)
    with open_engine(cfg.with_overrides(store=False)) as engine:
        info = engine.status()
    info.pop("slots")
    info["store"] = str(cfg.store_config().dir) if cfg.store else None
    if as_json:
        emit(info, True)
    else:
        for k, v in info.items():
            click.echo(f"{k:18} {v}")
