"""`efim serve` and `efim daemon start|stop|status|restart`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import build_config, config_mod, emit, main, model_options, pairs, user_errors


@main.command()
@click.option("--socket", "sock", type=click.Path(), help="Socket path (default: $XDG_RUNTIME_DIR/efim/efim.sock).")
@click.option("--watch", "roots", multiple=True, type=click.Path(file_okay=False),
              help="Workspace root to watch (repeatable).")
@click.option("--queue-size", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Requests that may wait; more are answered 'busy'.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@click.option("--config-stdin", is_flag=True, hidden=True, help="Read the whole configuration as JSON from stdin.")
@model_options
@user_errors
def serve(sock, roots, queue_size, verbose, config_stdin, **model_kw):
    """Run the daemon in the foreground (Ctrl-C stops it).

    \b
    Example:
      efim serve --watch ~/src/project
    """
    import logging
    import os
    import signal

    from ..api import open_engine
    from ..daemon import paths
    from ..daemon.server import Server

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if config_stdin:  # `efim daemon start`: the settings travel as configuration, not as argv
        settings = json.loads(sys.stdin.read())
        cfg, roots = config_mod.Config.from_json(settings["config"]), tuple(settings.get("watch", ())) + roots
    else:
        cfg = build_config(**model_kw)
    server = Server(Path(sock) if sock else None, queue_size=queue_size)
    try:
        server.bind()
        engine = open_engine(cfg)
    except BaseException:
        server.close()
        raise
    server.attach(engine)
    for r in roots:
        server.watcher.watch(r, pin=True)
    pid = paths.pid_file()
    paths.write_private(pid, f"{os.getpid()}\n")
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
@click.option("--watch", "roots", multiple=True, type=click.Path(file_okay=False),
              help="Workspace root to watch (repeatable).")
@model_options
@user_errors
def daemon_start(timeout, roots, **model_kw):
    """Start the daemon in the background (logs go to the state directory).

    \b
    Example:
      efim daemon start --model ~/models/qwen2.5-coder-1.5b.gguf
    """
    pid = start_daemon(timeout, build_config(**model_kw), roots)
    click.echo(f"efim daemon started (pid {pid})")


def start_daemon(timeout: float, cfg, roots=()) -> int:
    """Start ``efim serve`` in the background with configuration ``cfg``; returns its pid."""
    import os
    import subprocess
    import time

    from ..daemon import client, paths
    from ..errors import AlreadyRunning, DaemonError

    if client.running():
        raise AlreadyRunning(f"an efim daemon is already running on {paths.socket_path()}")
    settings = {"config": cfg.resolved().to_json(), "watch": [str(Path(r).resolve()) for r in roots]}
    # -P: the caller's working directory is not on sys.path (a local logging.py must not shadow ours).
    args = [sys.executable, "-P", "-m", "efim_local.cli", "serve", "--config-stdin"]
    log = os.fdopen(paths.open_private(paths.log_file(), os.O_WRONLY | os.O_APPEND), "ab")
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                            cwd=paths.log_file().parent)
    log.close()  # the child has its own copy
    proc.stdin.write(json.dumps(settings).encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.running():
            return proc.pid
        if proc.poll() is not None:
            raise DaemonError(f"the daemon exited with code {proc.returncode}; see {paths.log_file()}")
        time.sleep(0.1)
    raise DaemonError(f"the daemon did not answer within {timeout:.0f} s; see {paths.log_file()}")


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

    from ..daemon import client

    from ..errors import DaemonError, DaemonUnavailable

    try:
        with client.Client(timeout=5) as c:
            pid = c.call("status")["pid"]
            c.call("shutdown")
    except DaemonUnavailable:
        raise DaemonError("no efim daemon is running") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (client.running() or _alive(pid)):
        time.sleep(0.1)
    if client.running():
        raise DaemonError("the daemon did not stop")


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
    from ..daemon import client
    from ..errors import DaemonUnavailable

    try:
        with client.Client(timeout=10) as c:
            st = c.call("status")
    except DaemonUnavailable:
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
    click.echo(f"context      {st['n_slots']} slots x {st['n_ctx_seq']} tokens, "
               f"{st['threads']}+{st['threads_batch']} threads, KV {st['type_k']}/{st['type_v']}, "
               f"flash attention {'on' if st['flash_attn'] else 'off'}")
    click.echo(f"requests     {st['served']} served, {st['errors']} errors, {st['queued']} queued")
    for s in st["slots"]:
        click.echo(f"slot {s['slot']}       {s['tokens']:6} tokens  {s['path'] or '-'}")
    if st.get("store"):
        hits, misses = st["store"]["hits"], st["store"]["misses"]
        click.echo("hits         " + pairs(hits))
        click.echo("misses       " + pairs(misses))
        click.echo(f"sparse       {st['sparse_restore']}, {st['store']['sparse_restores']} restores")


@daemon.command("restart")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for it to answer.")
@click.option("--watch", "roots", multiple=True, type=click.Path(file_okay=False),
              help="Workspace root to watch (repeatable), besides those the running daemon watches.")
@model_options
@user_errors
def daemon_restart(timeout, roots, **model_kw):
    """Stop the daemon if it runs, then start it (it keeps watching the same folders).

    \b
    Example:
      efim daemon restart
    """
    from ..daemon import client
    from ..errors import DaemonUnavailable

    try:
        with client.Client(timeout=10) as c:
            roots = (*c.call("status").get("watching", ()), *roots)
        stop_daemon()
    except DaemonUnavailable:
        pass
    pid = start_daemon(timeout, build_config(**model_kw), roots)
    click.echo(f"efim daemon restarted (pid {pid})")
