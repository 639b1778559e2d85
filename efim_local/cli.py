"""The ``efim`` command line: a thin layer over the library API."""

from __future__ import annotations

import functools
import json
import sys

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
@model_options
@user_errors
def complete(path, line, column, from_stdin, max_tokens, temperature, stop_at_newline, max_lines, as_json, **model_kw):
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
    with open_engine(cfg) as engine:
        out = engine.complete(CompletionRequest(
            text=text, cursor=cursor, path=path, max_tokens=max_tokens, temperature=temperature,
            stop_at_newline=stop_at_newline, max_lines=max_lines))
    emit(out.to_json(), as_json, out.text + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
