"""`efim serve` and `efim daemon start|stop|status|restart`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..daemon.launch import start_daemon
from ..engine.completion import SOURCES
from . import build_config, config_mod, emit, main, model_options, pairs, tier_usage, user_errors


@main.command()
@click.option("--socket", "sock", type=click.Path(), help="Socket path (default: $EFIM_SOCKET, else "
              "$XDG_RUNTIME_DIR/efim/efim.sock, else ~/.cache/efim/run/efim.sock).")
@click.option("--watch", "roots", multiple=True, type=click.Path(exists=True, file_okay=False),
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
    import os
    import signal

    from ..api import open_engine
    from ..daemon import logs, paths
    from ..daemon.server import Server

    log_file = None
    if config_stdin:  # `efim daemon start`: the settings travel as configuration, not as argv
        settings = json.loads(sys.stdin.read())
        cfg, roots = config_mod.Config.from_json(settings["config"]), tuple(settings.get("watch", ())) + roots
        log_file, verbose = settings.get("log"), verbose or settings.get("verbose", False)
    else:
        cfg = build_config(**model_kw)
    logs.setup(verbose, log_file)  # a log file is rotated; efim's own messages only (DEBUG with -v)
    pid = paths.pid_file()
    paths.check_private(pid)  # before the model loads: a planted link is refused at once
    server = Server(Path(sock) if sock else None, queue_size=queue_size)
    try:
        server.bind()
        engine = open_engine(cfg)
    except BaseException:
        server.close()
        raise
    server.attach(engine)
    logs.log.info("model %s, layout %s (%s)", engine.model.path, engine.default_layout, engine.layout_reason)
    for r in roots:
        server.watcher.watch(r, pin=True)
    paths.write_private(pid, f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    logs.log.info("serving on %s (pid %d)", server.sock_path, os.getpid())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()  # saves dirty slots to disk
        if pid.exists() and pid.read_text().strip() == str(os.getpid()):
            pid.unlink()
        logs.log.info("stopped (pid %d)", os.getpid())


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
@click.option("--watch", "roots", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Workspace root to watch (repeatable).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages too.")
@model_options
@user_errors
def daemon_start(timeout, roots, verbose, **model_kw):
    """Start the daemon in the background (it logs to daemon.log in the state directory: `efim daemon logs`).

    \b
    Example:
      efim daemon start --model ~/models/qwen2.5-coder-1.5b.gguf
    """
    pid = start_daemon(timeout, build_config(**model_kw), roots, verbose)
    click.echo(f"efim daemon started (pid {pid})")


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
    auto = f" (automatic: {st['cores_free']} cores free)" if st.get("threads_auto") else ""
    click.echo(f"context      {st['n_slots']} slots x {st['n_ctx_seq']} tokens, "
               f"{st['threads']}+{st['threads_batch']} threads{auto}, KV {st['type_k']}/{st['type_v']}, "
               f"flash attention {'on' if st['flash_attn'] else 'off'}")
    click.echo(f"layout       {st['layout']}: {st['layout_reason']}")
    if "heal" in st:
        click.echo(f"healing      {'on' if st['heal'] else 'off'}: {st['heal_reason']}")
    req = st["requests"]
    lat = f", latency p50 {req['p50_ms']} ms / p95 {req['p95_ms']} ms (last {req['window']})" if req["window"] else ""
    click.echo(f"requests     {st['served']} served, {st['errors']} errors, {st['queued']} queued{lat}")
    if req.get("sources", {}).get("answers"):
        click.echo("answers      " + sources_text(req["sources"]))
    if req.get("context"):
        click.echo("context used " + context_text(req["context"]))
    click.echo("speed        " + speed_text(st))
    if st.get("context_help"):
        click.echo("would help   " + st["context_help"])
    if st.get("engine_time_s"):  # where the engine's time went, by kind of work
        click.echo("engine time  " + engine_time_text(st["engine_time_s"]))
    t = st.get("idle_task")  # what idle time is doing: the task started and the jobs it runs
    if t is None:
        click.echo("idle work    none")
    else:
        where = f" {t['path']}" if t["path"] else ""
        click.echo(f"idle work    {t['task']}{where}: {' > '.join(t['jobs']) or 'between two runs'}")
    for s in st["slots"]:
        state = f"{s['job']} ({s['phase']})" if s.get("job") else "idle"  # what runs in it as status asked
        path = (s["path"] if s["tokens"] else "") or "-"
        click.echo(f"slot {s['slot']}       {s['tokens']:6} tokens  {state:18} {path}")
    for path, f in req["files"].items():
        click.echo(f"file         {f['hit_rate']:6.0%} hits  {f['requests']:4} requests  {path}")
    if st.get("store"):
        hits, misses = st["store"]["hits"], st["store"]["misses"]
        for t, v in st["store"]["tiers"].items():
            click.echo(f"{t + ' tier':12} {tier_usage(v)}")
        click.echo("hits         " + pairs(hits))
        click.echo("misses       " + pairs(misses))
        click.echo(f"sparse       {st['sparse_restore']}, {st['store']['sparse_restores']} restores")


def context_text(c: dict) -> str:
    """'mean 1183 tokens (median 1429), 72% of the full plans, 47% reduced by the latency budget; last
    minute: 12 answers, 41% of the full plans, 9 reduced'."""
    text = (f"mean {c['mean_tokens']:.0f} tokens (median {c['median_tokens']}), {c['mean_share']:.0%} of the "
            f"full plans, {c['reduced']:.0%} reduced by the latency budget")
    m = c.get("last_minute")
    if m and m["requests"]:
        text += (f"; last minute: {m['requests']} answers, {m['mean_share']:.0%} of the full plans, "
                 f"{m['reduced']} reduced")
    elif m is not None:
        text += "; none in the last minute"
    return text


def speed_text(st: dict) -> str:
    """'prefill 351 tok/s, max_prompt_ms 300 (about 105 new tokens), other processes use 1.0 of 2
    cores': what the latency budget allows on this machine now."""
    tok_s, budget, n = st.get("prefill_tok_s"), st.get("max_prompt_ms"), st.get("budget_tokens")
    parts = [f"prefill {tok_s:.0f} tok/s" if tok_s else "prefill speed not learned yet"]
    if budget is not None:
        parts.append(f"max_prompt_ms {budget:g}" + (f" (about {n} new tokens)" if n else "") if budget else
                     "no latency budget (max_prompt_ms 0)")
    if st.get("cores_used_by_others") is not None:
        parts.append(f"other processes use {st['cores_used_by_others']:.1f} of {st.get('cores')} cores")
    return ", ".join(parts)


def engine_time_text(spent: dict) -> str:
    """'generate 10.8 s, idle_grow 28.6 s, ...': where the engine's time went, by kind of work."""
    return ", ".join(f"{k} {v:g} s" for k, v in spent.items())


def sources_text(src: dict) -> str:
    """'120 answers: 60 computed, 10 keystroke (8%), 40 type-through (33%), 6 accept (5%), 4 cache (3%)'."""
    parts = [f"{src['computed']} computed"] + [
        f"{src.get(s, 0)} {s} ({src.get(s.replace('-', '_') + '_rate') or 0:.0%})" for s in SOURCES[1:]]
    return f"{src['answers']} answers: " + ", ".join(parts)


@daemon.command("restart")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for it to answer.")
@click.option("--watch", "roots", multiple=True, type=click.Path(exists=True, file_okay=False),
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


@daemon.command("logs")
@click.option("-n", "--lines", type=click.IntRange(0), default=50, show_default=True, help="Lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (across rotations) until Ctrl-C.")
@user_errors
def daemon_logs(lines, follow):
    """Print the daemon's log: one line per request (path, layout, tokens, tier, re-anchor, ms).

    \b
    Examples:
      efim daemon logs -n 20
      efim daemon logs -f
    """
    import collections
    import os
    import time

    from ..daemon import paths

    path = paths.log_file()
    out = sys.stdout.buffer

    def reopen():
        try:
            return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
        except FileNotFoundError:
            return None

    f = reopen()
    if f is None and not follow:
        return click.echo(f"no daemon log yet ({path})")
    if f is not None:
        out.write(b"".join(collections.deque(f, maxlen=lines)))
        out.flush()
    try:
        while follow:
            time.sleep(0.2)
            if f is not None:
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                    continue
            try:  # rotated (a new file at the path) or truncated: start on the new one
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if f is None or st.st_ino != os.fstat(f.fileno()).st_ino or st.st_size < f.tell():
                if f is not None:
                    f.close()
                f = reopen()
    except KeyboardInterrupt:
        pass
