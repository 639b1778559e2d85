"""`efim serve` and `efim daemon start|stop|status|restart`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import build_config, emit, fail, main, model_options, pairs, user_errors


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

    from ..api import open_engine
    from ..daemon import paths
    from ..daemon.server import AlreadyRunning, Server

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

    from ..daemon import client, paths

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

    from ..daemon import client

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
    from ..daemon import client

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
        click.echo("hits         " + pairs(hits))
        click.echo("misses       " + pairs(misses))


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
    from ..daemon import client

    if client.running():
        stop_daemon()
    pid = start_daemon(timeout, model_kw)
    click.echo(f"efim daemon restarted (pid {pid})")
