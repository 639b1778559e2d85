"""`efim cache ls|stats|gc|clear`."""

from __future__ import annotations

import click

from . import MIB, config_mod, emit, main, pairs, tier_usage, user_errors


@main.group()
def cache():
    """Inspect and maintain the saved KV states.

    \b
    Examples:
      efim cache stats
      efim cache ls --json
      efim cache gc
    """


def _store_config():
    from ..kv.settings import store_config

    return store_config(config_mod.load()) or store_config(config_mod.Config())


def _store_dir():
    return _store_config().dir


def _admin_store():
    from ..kv import StateStore

    return StateStore.admin(_store_config())


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@user_errors
def cache_ls(as_json):
    """List saved states, least recently used first.

    \b
    Example:
      efim cache ls
    """
    with _admin_store() as store:
        rows = store.index.rows()
    if as_json:
        return emit(rows, True)
    if not rows:
        return click.echo(f"no saved states in {_store_dir()}")
    click.echo(f"{'id':12}  {'tier':4}  {'tokens':>6}  {'MiB':>8}  {'hits':>4}  path")
    for r in rows:
        click.echo(f"{r['id'][:12]}  {r['tier']:4}  {r['n_tokens']:6}  {r['bytes'] / MIB:8.2f}  "
                   f"{r['hits']:4}  {r['path']}")


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_stats(as_json):
    """Tier usage against budgets, hits per tier, misses by reason.

    \b
    Example:
      efim cache stats --json
    """
    with _admin_store() as store:
        st = store.stats()
        bad = _unreadable(store)
    st["corrupt"] = len(bad)
    if bad:
        click.echo(f"efim: warning: {len(bad)} saved state{'s are' if len(bad) > 1 else ' is'} unreadable "
                   f"({bad[0][1]}); counted above, dropped when next looked up (or now: efim cache clear)", err=True)
    if as_json:
        return emit(st, True)
    for t, v in st["tiers"].items():
        click.echo(f"{t:5} {tier_usage(v)}")
    click.echo("hits    " + pairs(st["hits"]))
    click.echo("misses  " + pairs(st["misses"]))
    click.echo(f"sparse  restores={st['sparse_restores']}  shrunk_disk={st['shrunk_disk']}  "
               f"evicted_disk={st['evicted_disk']}")
    if st["dropped"]:
        click.echo("dropped " + pairs(st["dropped"]))


def _unreadable(store) -> list[tuple[str, str]]:
    """(id, why) of the disk states whose header, size or token list is bad (no checksum: cheap)."""
    from ..errors import StateFileError
    from ..kv import stateformat

    bad = []
    for r in store.index.rows():
        if r["tier"] != "disk":
            continue
        try:
            stateformat.read_tokens(store.file_of(r["id"]))
        except (StateFileError, OSError) as e:
            bad.append((r["id"], str(e) or type(e).__name__))
    return bad


@cache.command("gc")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_gc(as_json):
    """Reconcile the index with the files (both ways) and enforce the budgets.

    \b
    Example:
      efim cache gc
    """
    with _admin_store() as store:
        out = store.gc()
    emit(out, as_json, pairs(out) + "\n")


@cache.command("clear")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def cache_clear(as_json):
    """Delete every saved state.

    \b
    Example:
      efim cache clear
    """
    from ..daemon import client
    from ..errors import DaemonUnavailable

    out = {"deleted": 0, "daemon": False}
    try:  # a running daemon holds states in its slots and RAM tier, which it would write back
        with client.Client(timeout=30) as c:
            out.update(c.call("clearCache"), daemon=True)
    except DaemonUnavailable:
        pass
    with _admin_store() as store:  # this configuration's store (the daemon may use another)
        out["deleted"] += len(store.index.rows())
        store.clear()
    also = " (and the running daemon's slots)" if out["daemon"] else ""
    emit(out, as_json, f"deleted {out['deleted']} states{also}\n")
