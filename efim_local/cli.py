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
from .templates import TemplateError

USER_ERRORS = (DocumentError, PlanError, TemplateError, ConfigError, BackendError, OSError)


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
@model_options
@user_errors
def complete(path, line, column, from_stdin, max_tokens, temperature, stop_at_newline, max_lines, as_json,
             no_cache, **model_kw):
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
    cfg = build_config(**model_kw)
    if no_cache:
        cfg = cfg.with_overrides(store=False)
    key = str(Path(path).resolve()) if not from_stdin else path
    with open_engine(cfg) as engine:
        out = engine.complete(CompletionRequest(
            text=text, cursor=cursor, path=key, max_tokens=max_tokens, temperature=temperature,
            stop_at_newline=stop_at_newline, max_lines=max_lines))
        emit(out.to_json(), as_json, out.text + "\n")
        sys.stdout.flush()  # the answer is out before the state is written (on close)


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


if __name__ == "__main__":  # pragma: no cover
    main()
