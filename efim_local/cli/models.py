"""`efim models list|pull|use`: from install to a useful model in one step (efim_local/catalog.py)."""

from __future__ import annotations

import click

from . import emit, main, user_errors


@main.group()
def models():
    """Known FIM models: list them, download one, make it the default.

    \b
    Examples:
      efim models list
      efim models pull qwen2.5-coder-1.5b
      efim models use qwen2.5-coder-1.5b
    """


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (known and installed models).")
@user_errors
def models_list(as_json):
    """Known models (size, RAM needed, layout that suits them) and the ones downloaded.

    \b
    Example:
      efim models list --json
    """
    from .. import catalog

    out = catalog.listing()
    if as_json:
        return emit(out, True)
    click.echo(f"{'name':22} {'params':>7} {'file':>9} {'RAM':>9}  {'layout':6}  installed")
    for m in out["known"]:
        click.echo(f"{m['name']:22} {m['params']:>7} {_mib(m['size_mb']):>9} {_mib(m['ram_mb']):>9}  "
                   f"{m['layout']:6}  {'yes' if m['installed'] else '-'}")
    other = [i for i in out["installed"] if not any(k["installed"] and k["path"] == i["path"] for k in out["known"])]
    for i in other:
        click.echo(f"{i['name']:22} {'':>7} {_mib(i['size_mb']):>9} {'':>9}  {'':6}  {i['path']}")
    click.echo(f"models in {out['dir']}")


def _mib(n: int) -> str:
    return f"{n / 1024:.1f} GiB" if n >= 1024 else f"{n} MiB"


@models.command("pull")
@click.argument("name")
@click.option("--use", "use_it", is_flag=True, help="Then make it the default model (like `efim models use`).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def models_pull(name, use_it, as_json):
    """Download a known model, or any GGUF as hf:OWNER/REPO/FILE.gguf, and check it.

    Downloads resume, a complete file is not fetched again, HF_TOKEN (or `hf auth login`) gives
    access to gated repositories and HF_ENDPOINT selects a mirror.

    \b
    Examples:
      efim models pull qwen2.5-coder-1.5b
      efim models pull hf:ggml-org/Qwen2.5-Coder-3B-Q8_0-GGUF/qwen2.5-coder-3b-q8_0.gguf --use
    """
    from .. import catalog

    info = catalog.pull(name, progress=not as_json)
    if use_it:
        info["config"] = str(catalog.write_model_setting(catalog.resolve_use(info["path"])))
    if as_json:
        return emit(info, True)
    fim = f"FIM tokens ({info['fim_source']})" if info["fim"] else "no FIM tokens"
    click.echo(f"{info['name']}: {info['path']} ({info['size_mb']} MiB, {info['architecture']}, {fim}, "
               f"layout {info['layout']})")
    if use_it:
        click.echo(f"model set in {info['config']}")
    elif info["fim"]:
        click.echo(f"use it: efim models use {info['name'] if catalog.find(info['name']) else info['path']}")


@models.command("use")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def models_use(name, as_json):
    """Make a downloaded model (or a GGUF file) the default: writes `model` into the config file.

    A running daemon keeps its model until `efim daemon restart`.

    \b
    Examples:
      efim models use qwen2.5-coder-1.5b
      efim models use ~/models/my-coder.gguf
    """
    from .. import catalog

    path = catalog.resolve_use(name)
    cfg = catalog.write_model_setting(path)
    emit({"model": str(path), "config": str(cfg)}, as_json, f"model = {path} (in {cfg})\n")
