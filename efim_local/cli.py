"""The ``efim`` command line: a thin layer over the library API."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from . import config as config_mod
from .backend import BackendError
from .config import ConfigError
from .document import DocumentError, decode, offset_of, read_source
from .planner import PlanError
from .daemon.protocol import RpcError
from .templates import TemplateError

USER_ERRORS = (DocumentError, PlanError, TemplateError, ConfigError, BackendError, OSError, RpcError)


def fail(msg: str) -> None:
    click.echo(f"efim: error: {msg}", err=True)
    sys.exit(2)


def user_errors(fn):
    """Turn expected failures into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except USER_ERRORS as e:
            fail(str(e) or e.__class__.__name__)

    return wrapper


def emit(obj, as_json: bool, text: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj, ensure_ascii=False))
    else:
        click.echo(text if text is not None else obj, nl=False if text is not None else True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="efim-local")
def main():
    """efim: fast local code completion with EFIM prompts and KV cache reuse.

    \b
    Example:
      efim complete src/app.py --line 12 --column 9
    """


def model_options(fn):
    """Options that choose and configure the model, shared by commands that load it."""
    opts = [
        click.option("--model", "-m", type=click.Path(dir_okay=False), help="GGUF model (default: $EFIM_MODEL, config, bundled)."),
        click.option("--layout", type=click.Choice(["efim", "fim"]), help="Prompt layout (default: efim for fragment-trained models)."),
        click.option("--fim-template", help="Text markers 'PRE,SUF,MID[,psm|spm]' for models without FIM tokens."),
        click.option("--fim-family", help="Force a template family: qwen, deepseek, starcoder, codellama, codestral, codegemma, granite."),
        click.option("--n-ctx", type=click.IntRange(64, 1 << 20), help="Context tokens per slot."),
        click.option("--threads", type=click.IntRange(0, 1024), help="CPU threads (0: all)."),
        click.option("--n-gpu-layers", type=click.IntRange(0, 100000), help="Layers to offload (CUDA builds)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def build_config(model, layout, fim_template, fim_family, n_ctx, threads, n_gpu_layers, **extra):
    cfg = config_mod.load()
    return cfg.with_overrides(model=model, layout=layout, fim_template=fim_template, fim_family=fim_family,
                              n_ctx_seq=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, **extra)


@main.command()
@click.argument("path", type=click.Path(dir_okay=True))
@click.option("--line", "-l", type=click.IntRange(1), required=True, help="Cursor line, 1-based.")
@click.option("--column", "-c", type=click.IntRange(1), required=True, help="Cursor column, 1-based, in characters.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the document from standard input; PATH only names it.")
@click.option("--max-tokens", type=click.IntRange(1, 4096), help="Most tokens to generate.")
@click.option("--temperature", type=click.FloatRange(0, 5), default=0.0, show_default=True)
@click.option("--stop-at-newline", is_flag=True, help="Stop at the end of the first line.")
@click.option("--max-lines", type=click.IntRange(1, 1000), help="Stop after this many lines.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the text.")
@click.option("--no-cache", is_flag=True, help="Neither restore nor save KV states.")
@click.option("--no-daemon", is_flag=True, help="Run in-process even if a daemon is running.")
@click.option("--start-daemon", is_flag=True, help="Start the daemon if it is not running, then use it.")
@model_options
@user_errors
def complete(path, line, column, from_stdin, max_tokens, temperature, stop_at_newline, max_lines, as_json,
             no_cache, no_daemon, start_daemon, **model_kw):
    """Complete the code at a cursor position in PATH.

    \b
    Examples:
      efim complete app.py --line 3 --column 5
      cat app.py | efim complete app.py --stdin -l 3 -c 5 --json
    """
    from .engine import CompletionRequest
    from .api import open_engine

    text = decode(sys.stdin.buffer.read(), "standard input") if from_stdin else read_source(path)
    cursor = offset_of(text, line - 1, column - 1)
    key = str(Path(path).resolve()) if not from_stdin else path
    # Model options other than the layout describe another engine than the daemon's.
    own_model = any(v is not None for k, v in model_kw.items() if k != "layout")
    if not (no_daemon or no_cache or own_model):
        out = _complete_via_daemon(start_daemon, key, text, cursor, max_tokens, temperature, stop_at_newline,
                                   max_lines, model_kw.get("layout"))
        if out is not None:
            return emit(out, as_json, out["text"] + "\n")
    cfg = build_config(**model_kw)
    if no_cache:
        cfg = cfg.with_overrides(store=False)
    with open_engine(cfg) as engine:
        out = engine.complete(CompletionRequest(
            text=text, cursor=cursor, path=key, max_tokens=max_tokens, temperature=temperature,
            stop_at_newline=stop_at_newline, max_lines=max_lines))
        emit(out.to_json(), as_json, out.text + "\n")
        sys.stdout.flush()  # the answer is out before the state is written (on close)


def _complete_via_daemon(start, path, text, cursor, max_tokens, temperature, stop_at_newline, max_lines, layout):
    """The daemon's answer, or None when no daemon runs (and none was asked for)."""
    from .daemon import client
    from .daemon.protocol import RpcError

    if start and not client.running():
        start_daemon(120.0, {})
    params = {"path": path, "text": text, "offset": cursor, "max_tokens": max_tokens, "temperature": temperature,
              "stop_at_newline": stop_at_newline, "max_lines": max_lines, "layout": layout}
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
    from .api import open_engine
    from .backend._lib import library_path

    cfg = build_config(**model_kw)
    with open_engine(cfg.with_overrides(store=False)) as engine:
        info = {
            "model": str(engine.model.path), "description": engine.model.description(),
            "library": library_path(), "layout": engine.default_layout,
            "fragment_trained": engine.fragment_trained, "template": engine.template.source,
            "slots": cfg.context.n_slots, "n_ctx_seq": cfg.context.n_ctx_seq,
            "sliding_window": engine.model.n_swa, "swa_strategy": engine.swa_strategy,
            "state_restore": "whole-state checkpoints" if engine.swa else "longest prefix",
            "store": str(cfg.store_config().dir) if cfg.store else None,
        }
    if as_json:
        emit(info, True)
    else:
        for k, v in info.items():
            click.echo(f"{k:18} {v}")


@main.group()
def cache():
    """Inspect and maintain the saved KV states.

    \b
    Examples:
      efim cache stats
      efim cache ls --json
      efim cache gc
    """


def _admin_store():
    from .store import StateStore

    return StateStore.admin(config_mod.load().store_config() or config_mod.Config().store_config())


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@user_errors
def cache_ls(as_json):
    """List saved states, least recently used first.

    \b
    Example:
      efim cache ls
    """
    store = _admin_store()
    rows = store.index.rows()
    store.close()
    if as_json:
        return emit(rows, True)
    for r in rows:
        click.echo(f"{r['id'][:12]}  {r['tier']:4}  {r['n_tokens']:6} tok  {r['bytes'] / 1e6:8.2f} MB  "
                   f"{r['hits']:4} hits  {r['path']}")


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_stats(as_json):
    """Tier usage against budgets, hits per tier, misses by reason.

    \b
    Example:
      efim cache stats --json
    """
    store = _admin_store()
    st = store.stats()
    store.close()
    if as_json:
        return emit(st, True)
    for t, v in st["tiers"].items():
        click.echo(f"{t:5} {v['states']:5} states  {v['bytes'] / 1e6:9.2f} / {v['budget_bytes'] / 1e6:.0f} MB")
    click.echo("hits    " + "  ".join(f"{k}={v}" for k, v in st["hits"].items()))
    click.echo("misses  " + "  ".join(f"{k}={v}" for k, v in st["misses"].items()))
    if st["dropped"]:
        click.echo("dropped " + "  ".join(f"{k}={v}" for k, v in st["dropped"].items()))


@cache.command("gc")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_gc(as_json):
    """Reconcile the index with the files (both ways) and enforce the budgets.

    \b
    Example:
      efim cache gc
    """
    store = _admin_store()
    out = store.gc()
    store.close()
    emit(out, as_json, " ".join(f"{k}={v}" for k, v in out.items()) + "\n")


@cache.command("clear")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_clear(as_json):
    """Delete every saved state.

    \b
    Example:
      efim cache clear
    """
    store = _admin_store()
    n = len(store.index.rows())
    store.clear()
    store.close()
    emit({"deleted": n}, as_json, f"deleted {n} states\n")




# -- the daemon -----------------------------------------------------------------------

@main.command()
@click.option("--socket", "sock", type=click.Path(), help="Socket path (default: $XDG_RUNTIME_DIR/efim/efim.sock).")
@click.option("--watch", "roots", multiple=True, type=click.Path(file_okay=False), help="Workspace root to watch (repeatable).")
@click.option("--queue-size", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Requests that may wait; more are answered 'busy'.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@model_options
@user_errors
def serve(sock, roots, queue_size, verbose, **model_kw):
    """Run the daemon in the foreground (Ctrl-C stops it).

    \b
    Example:
      efim serve --watch ~/src/project
    """
    import logging
    import os
    import signal

    from .api import open_engine
    from .daemon import paths
    from .daemon.server import AlreadyRunning, Server

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = build_config(**model_kw)
    server = Server(Path(sock) if sock else None, queue_size=queue_size)
    try:
        server.bind()
    except AlreadyRunning as e:
        fail(str(e))
    try:
        engine = open_engine(cfg)
    except BaseException:
        server.close()
        raise
    server.attach(engine)
    for r in roots:
        server.watcher.watch(r)
    pid = paths.pid_file()
    pid.write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    click.echo(f"efim: serving on {server.sock_path}", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()  # saves dirty slots to disk
        if pid.exists() and pid.read_text().strip() == str(os.getpid()):
            pid.unlink()


@main.group()
def daemon():
    """Run the daemon in the background.

    \b
    Examples:
      efim daemon start
      efim daemon status --json
      efim daemon stop
    """


@daemon.command("start")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for it to answer.")
@model_options
@user_errors
def daemon_start(timeout, **model_kw):
    """Start the daemon in the background (logs go to the state directory).

    \b
    Example:
      efim daemon start --model ~/models/qwen2.5-coder-1.5b.gguf
    """
    pid = start_daemon(timeout, model_kw)
    click.echo(f"efim daemon started (pid {pid})")


def start_daemon(timeout: float, model_kw: dict) -> int:
    import subprocess
    import time

    from .daemon import client, paths

    if client.running():
        fail(f"an efim daemon is already running on {paths.socket_path()}")
    args = [sys.executable, "-m", "efim_local.cli", "serve"]
    for k, v in model_kw.items():
        if v is not None:
            args += [f"--{k.replace('_', '-')}", str(v)]
    log = open(paths.log_file(), "ab")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.running():
            return proc.pid
        if proc.poll() is not None:
            fail(f"the daemon exited with code {proc.returncode}; see {paths.log_file()}")
        time.sleep(0.1)
    fail(f"the daemon did not answer within {timeout:.0f} s; see {paths.log_file()}")


@daemon.command("stop")
@user_errors
def daemon_stop():
    """Stop the running daemon (it saves its KV states first).

    \b
    Example:
      efim daemon stop
    """
    stop_daemon()
    click.echo("efim daemon stopped")


def stop_daemon(timeout: float = 60.0) -> None:
    import time

    from .daemon import client, paths

    try:
        with client.Client(timeout=5) as c:
            pid = c.call("status")["pid"]
            c.call("shutdown")
    except client.DaemonUnavailable:
        fail("no efim daemon is running")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (client.running() or _alive(pid)):
        time.sleep(0.1)
    if client.running():
        fail("the daemon did not stop")


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


@daemon.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def daemon_status(as_json):
    """Show the daemon's socket, model, slots, tier usage and hit rates.

    \b
    Example:
      efim daemon status --json
    """
    from .daemon import client

    try:
        with client.Client(timeout=10) as c:
            st = c.call("status")
    except client.DaemonUnavailable:
        if as_json:
            emit({"running": False}, True)
        else:
            click.echo("efim daemon is not running")
        sys.exit(1)
    st["running"] = True
    if as_json:
        return emit(st, True)
    click.echo(f"running      pid {st['pid']} on {st['socket']}, up {st['uptime_s']} s")
    click.echo(f"model        {st['model']} ({st['layout']}, sliding window: {st['swa_strategy']})")
    click.echo(f"requests     {st['served']} served, {st['errors']} errors, {st['queued']} queued")
    for s in st["slots"]:
        click.echo(f"slot {s['slot']}       {s['tokens']:6} tokens  {s['path'] or '-'}")
    if st.get("store"):
        hits, misses = st["store"]["hits"], st["store"]["misses"]
        click.echo("hits         " + "  ".join(f"{k}={v}" for k, v in hits.items()))
        click.echo("misses       " + "  ".join(f"{k}={v}" for k, v in misses.items()))


@daemon.command("restart")
@click.option("--timeout", type=float, default=120.0, show_default=True)
@model_options
@user_errors
def daemon_restart(timeout, **model_kw):
    """Stop the daemon if it runs, then start it.

    \b
    Example:
      efim daemon restart
    """
    from .daemon import client

    if client.running():
        stop_daemon()
    pid = start_daemon(timeout, model_kw)
    click.echo(f"efim daemon restarted (pid {pid})")


if __name__ == "__main__":  # pragma: no cover
    main()
