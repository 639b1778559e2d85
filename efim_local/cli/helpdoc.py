"""docs/cli.md from the commands' own ``--help``: walks the click group, so a new command shows up.

docs/cli.md runs :func:`markdown` through cog (``cog -r docs/cli.md``); the tests run
``cog --check`` on it. Hidden commands are skipped and click leaves hidden options out.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

WIDTH = 88  # help text width, fixed so the output does not depend on the terminal


def commands(group: click.Command | None = None, name: str = "efim",
             parent: click.Context | None = None) -> Iterator[tuple[str, click.Context]]:
    """(full command name, its context) for the group and every visible subcommand, depth first."""
    if group is None:
        from . import main as group
    ctx = group.make_context(name, [], parent=parent, resilient_parsing=True, terminal_width=WIDTH)
    full = f"{parent.command_path} {name}" if parent is not None else name
    yield full, ctx
    if isinstance(group, click.Group):
        for sub in group.list_commands(ctx):
            cmd = group.get_command(ctx, sub)
            if cmd is not None and not cmd.hidden:
                yield from commands(cmd, sub, ctx)


def markdown() -> str:
    """One section per command: its name and its verbatim ``--help``."""
    return "\n".join(f"## `{full}`\n\n```text\n$ {full} --help\n{ctx.get_help()}\n```\n" for full, ctx in commands())
