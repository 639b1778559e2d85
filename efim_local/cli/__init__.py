"""The ``efim`` command line: a thin layer over the library API.

Commands live in small modules: complete.py (complete, status), cache.py, daemon.py (serve, daemon),
bench.py and bench_more.py. helpdoc.py renders every command's help into docs/cli.md.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from .. import __version__
from .. import config as config_mod
from ..errors import EfimError, one_line
from ..request import LAYOUTS


def fail(msg: str, code: int = 1) -> None:
    """One line on stderr, then exit (2: a usage error; 1: anything else)."""
    click.echo(f"efim: error: {one_line(msg)}", err=True)
    sys.exit(code)


def user_errors(fn):
    """Turn failures into one line on stderr and the error's exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except BrokenPipeError:  # the reader went away (`| head`): nothing to report
            sys.stderr.close()
            sys.exit(0)
        except EfimError as e:
            fail(str(e) or e.__class__.__name__, e.exit_code)
        except OSError as e:  # the file system said no: not a usage error
            fail(str(e) or e.__class__.__name__, 1)

    return wrapper


def emit(obj, as_json: bool, text: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj, ensure_ascii=False))
    else:
        click.echo(text if text is not None else obj, nl=False if text is not None else True)


NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class Efim(click.Group):
    """The ``efim`` group: click's usage errors as one line (exit 2) and Ctrl-C as exit 130, never
    click's several-line usage block or "Aborted!"."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NO_ARGS as e:  # a group without its command: its help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            fail(e.format_message() + where, 2)
        except click.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except click.Abort:  # (click has ended the line)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=Efim, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", package_name="efim-local")  # given: no importlib.metadata
def main():
    """efim: fast local code completion with EFIM prompts and KV cache reuse.

    \b
    Example:
      efim complete src/app.py --line 12 --column 9

    \b
    Shell completion (bash; zsh_source and fish_source for the others):
      eval "$(_EFIM_COMPLETE=bash_source efim)"    # in ~/.bashrc
    """


def model_options(fn):
    """Options that choose and configure the model, shared by commands that load it."""
    opts = [
        click.option("--model", "-m", type=click.Path(dir_okay=False),
                     help="GGUF model (default: $EFIM_MODEL, config, bundled)."),
        click.option("--layout", type=click.Choice(LAYOUTS),
                     help="Prompt layout (default: the model's; efim, docs/models.md)."),
        click.option("--fim-template", help="Text markers 'PRE,SUF,MID[,psm|spm]' for models without FIM tokens."),
        click.option("--fim-family", help="Force a template family: qwen, deepseek, starcoder, codellama, codestral, "
                                          "codegemma, granite."),
        click.option("--n-ctx", type=click.IntRange(64, 1 << 20), help="Context tokens per slot."),
        click.option("--threads", type=click.IntRange(0, 1024),
                     help="Threads for single-token decodes (0: the cores other processes leave free)."),
        click.option("--threads-batch", type=click.IntRange(0, 1024),
                     help="Threads for prefill batches (0: the cores other processes leave free)."),
        click.option("--n-gpu-layers", type=click.IntRange(0, 100000), help="Layers to offload (CUDA builds)."),
        click.option("--main-gpu", type=click.IntRange(0, 1024),
                     help="GPU for the model and scratch buffers (CUDA builds)."),
        click.option("--offload-kqv/--no-offload-kqv", default=None,
                     help="Keep the KV cache and attention on the GPU (CUDA builds)."),
        click.option("--flash-attn/--no-flash-attn", default=None, help="Use flash attention."),
        click.option("--backend", metavar="URL[,URL...]",
                     help="Remote servers that run the prompts (llama-server; docs/team.md). The model is "
                          "then loaded for its vocabulary only."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses NaN (which compares false with both bounds, so passes them)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number.", param, ctx)
        return v


def request_options(fn):
    """The completion request's options, from its one definition (efim_local/request.py)."""
    from ..request import CompletionRequest

    for name, default, meta in reversed(CompletionRequest.options()):
        if not meta["cli"] or name == "layout":  # --layout comes with the model options
            continue
        flag = "--" + name.replace("_", "-")
        if meta["kind"] is bool and default is None:  # on or off, else the model's default
            opt = click.option(f"{flag}/--no-{flag[2:]}", default=None, help=meta["help"])
        elif meta["kind"] is bool:
            opt = click.option(flag, is_flag=True, default=None, help=meta["help"])
        else:
            lo, hi = meta["lo"], meta["hi"]
            kind = FiniteFloatRange(lo, hi) if meta["kind"] is float else click.IntRange(lo, hi)
            opt = click.option(flag, type=kind, default=None, help=meta["help"])
        fn = opt(fn)
    return fn


# Command-line option names that differ from the config's field names.
CONFIG_NAMES = {"n_ctx": "n_ctx_seq", "threads": "n_threads", "threads_batch": "n_threads_batch"}


def build_config(**options):
    """The config file's settings with the command line's on top (None: not given). ``options`` are
    the model options (model_options) and any config field."""
    cfg = config_mod.load()
    return cfg.with_overrides(**{CONFIG_NAMES.get(k, k): v for k, v in options.items()})


def pairs(d: dict) -> str:
    """'k=v  k=v' for one-line summaries."""
    return "  ".join(f"{k}={v}" for k, v in d.items())


MIB = 1 << 20  # sizes are shown in MiB, like the budgets (ram_mb = 512 is 512 MiB)


def tier_usage(t: dict) -> str:
    """'3 states  1.25 / 512 MiB' for a store tier's stats."""
    return f"{t['states']:5} states  {t['bytes'] / MIB:9.2f} / {t['budget_bytes'] / MIB:.0f} MiB"


from . import bench, bench_more, cache, complete, daemon, lsp, models  # noqa: E402,F401  (registers the commands)
