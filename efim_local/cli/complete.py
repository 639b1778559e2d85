"""`efim complete` and `efim status`."""

from __future__ import annotations

import sys
from dataclasses import replace
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
@click.option("-v", "--verbose", is_flag=True,
              help="Say on stderr which path answered (daemon or in-process) and the context it used.")
@model_options
@user_errors
def complete(path, line, column, from_stdin, as_json, no_cache, no_daemon, start_daemon, verbose, **kw):
    """Complete the code at a cursor position in PATH.

    One answer is awaited, so it uses the whole plan unless --max-prompt-ms is given (a daemon's
    latency budget is for editors' keystrokes).

    \b
    Examples:
      efim complete app.py --line 3 --column 5
      cat app.py | efim complete app.py --stdin -l 3 -c 5 --json
    """
    from ..request import CompletionRequest

    req_names = {name for name, _, _ in CompletionRequest.options()}
    model_kw = {k: v for k, v in kw.items() if k not in req_names or k == "layout"}
    text = decode(sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1), "standard input") if from_stdin else read_source(path)
    cursor = offset_of(text, line - 1, column - 1)
    req = CompletionRequest(text=text, cursor=cursor, path=str(Path(path).resolve()),  # (--stdin: the same key)
                            **{k: v for k, v in kw.items() if k in req_names and v is not None})
    if req.how.max_prompt_ms is None:  # one answer is awaited, and no keystroke follows: the whole plan, by
        # the daemon too (its budget is for editors: a cold file's answer from 1% of it was often wrong)
        req = CompletionRequest.of(req.where, replace(req.how, max_prompt_ms=0.0))
    # Model options other than the layout describe another engine than the daemon's.
    own = [k for k, v in model_kw.items() if k != "layout" and v is not None]
    forced = "--no-daemon" if no_daemon else "--no-cache" if no_cache else \
        "--" + own[0].replace("_", "-") if own else None
    if forced is None:
        config_mod.load()  # a broken or missing EFIM_CONFIG is an error with a daemon too
        out = _complete_via_daemon(start_daemon, req)
        if out is not None:
            if verbose:
                click.echo(f"efim: answered by the daemon on {out.pop('_socket')}", err=True)
                say_context(out)
            out.pop("_socket", None)
            say_empty(out, as_json)
            return emit({**out, "via": "daemon"}, as_json, out["text"] + "\n")
        why = "no daemon is running"
    else:
        why = f"{forced} given"
        if forced != "--no-daemon" and _daemon_running():  # never bypass a running daemon silently
            click.echo(f"efim: a daemon is running, but {forced} needs its own engine: answering in-process",
                       err=True)
    if verbose:
        click.echo(f"efim: answering in-process ({why})", err=True)
    from ..api import open_engine

    cfg = build_config(**model_kw)
    if no_cache:
        cfg = cfg.with_overrides(store=False)
    with open_engine(cfg) as engine:
        out = engine.complete(req).to_json()
        if verbose:
            say_context(out)
        say_empty(out, as_json)
        emit({**out, "via": "in-process"}, as_json, out["text"] + "\n")
        sys.stdout.flush()  # the answer is out before the state is written (on close)


def say_empty(out: dict, as_json: bool) -> None:
    """An empty answer says so, and why (the model ended the middle at once, or a stop rule did):
    on stderr, and in the JSON as ``empty``."""
    if out.get("text"):
        return
    why = {"eog": "the model ended the middle at once", "max_tokens": "max_tokens allows no token"}.get(
        out.get("stop_reason"), f"the answer stopped at once ({out.get('stop_reason')})")
    c = out.get("context") or {}
    hint = f" (from a context reduced by the {cut_by(c)}: --max-prompt-ms 0 uses all of it)" if c.get(
        "reduced") else ""
    out["empty"] = why + hint
    if not as_json:
        click.echo(f"efim: empty answer: {why}{hint}", err=True)


def cut_by(c: dict) -> str:
    """What reduced a context, and why: 'latency budget 300 ms; the other 2900 tokens need 8.3 s ...'."""
    return (c.get("reduced_by") or {}).get("text") or "latency budget"


def say_context(out: dict) -> None:
    """On stderr: the context the answer used, and whether the latency budget cut it."""
    c = out.get("context") or {}
    if "tokens" in c and c.get("full_tokens"):
        cut = f", reduced by the {cut_by(c)}" if c.get("reduced") else ""
        click.echo(f"efim: context {c['tokens']} of {c['full_tokens']} tokens ({c['share']:.0%}){cut}", err=True)


def _daemon_running() -> bool:
    from ..daemon import client

    return client.running()


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
            return {**c.call("complete", params), "_socket": c.path}
    except DaemonUnavailable:
        return None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@model_options
@user_errors
def status(as_json, **model_kw):
    """Show the model, backend library, layout (and why), sliding-window strategy and KV store.

    When a daemon runs (and no model option is given) this is the daemon's engine; otherwise the
    model is loaded in-process to inspect it.

    \b
    Example:
      efim status --json
    """
    info = None
    config_mod.load()  # a broken or missing EFIM_CONFIG is an error even when the daemon answers
    if not any(v is not None for v in model_kw.values()):
        from ..daemon import client
        from ..errors import DaemonUnavailable

        try:
            with client.Client(timeout=10) as c:
                info = {**c.call("status"), "via": "daemon"}
        except DaemonUnavailable:
            pass
    if info is None:
        from ..api import open_engine

        cfg = build_config(**model_kw)
        from ..engine.reduction import help_text
        from ..kv.settings import store_config

        with open_engine(cfg.with_overrides(store=False)) as engine:
            if cfg.store:  # the speed a daemon or an earlier run learned here
                engine.read_speed(store_config(cfg).dir)
            engine.status_report.measure_cores()  # nothing has decoded yet: a window of its own
            engine.fit_threads()  # the threads a first decode would take
            info = engine.status()
        info["context_help"] = help_text(info)
        info["store"] = str(store_config(cfg).dir) if cfg.store else None
        info["via"] = "in-process"
    keys = ("model", "description", "library", "library_source", "gpu_offload", "layout", "layout_reason",
            "heal", "heal_reason", "fragment_trained", "template", "fim_family", "n_slots", "n_ctx_seq", "threads",
            "threads_batch", "threads_auto", "cores", "cores_free", "cores_used_by_others", "max_prompt_ms",
            "prefill_tok_s", "budget_tokens", "type_k", "type_v", "flash_attn", "offload_kqv", "sliding_window",
            "swa_strategy", "state_restore", "sparse_restore", "via")
    out = {k: info[k] for k in keys if k in info}
    if info["via"] == "daemon":
        out.update(daemon_pid=info["pid"], socket=info["socket"], context=info["requests"].get("context"),
                   answers=info["requests"].get("sources"), engine_time_s=info.get("engine_time_s"))
    out["context_help"] = info.get("context_help")
    store = info.get("store")  # (the daemon's is a dict of its tiers: its directory, as in-process)
    out["store"] = store.get("dir") if isinstance(store, dict) else store
    if as_json:
        return emit(out, True)
    from .daemon import context_text, engine_time_text, sources_text

    text = {"context": lambda c: context_text(c) if c else "no request yet",
            "answers": lambda a: sources_text(a) if a and a.get("answers") else "none yet",
            "engine_time_s": lambda t: engine_time_text(t) if t else "none yet"}
    for k, v in out.items():
        click.echo(f"{k:20} {text[k](v) if k in text else v}")
