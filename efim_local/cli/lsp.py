"""`efim lsp`: the language server for editors (VS Code, Neovim 0.12, Emacs lsp-mode, ...)."""

from __future__ import annotations

import click

from . import main


@main.command()
@click.option("--socket", "sock", type=click.Path(dir_okay=False),
              help="Daemon socket (default: $EFIM_SOCKET, else $XDG_RUNTIME_DIR/efim/efim.sock, else "
                   "~/.cache/efim/run/efim.sock).")
@click.option("--log-file", type=click.Path(dir_okay=False), envvar="EFIM_LSP_LOG",
              help="Write the server's log here (default: stderr; $EFIM_LSP_LOG).")
@click.option("-v", "--verbose", is_flag=True, envvar="EFIM_LSP_VERBOSE",
              help="Log debug messages, every LSP message included ($EFIM_LSP_VERBOSE=1).")
def lsp(sock, log_file, verbose):
    """Run a language server on stdin/stdout that relays to the efim daemon.

    It starts the daemon when none runs, so editors share one model and one KV
    cache. Serves textDocument/inlineCompletion (LSP 3.18); see docs/editors.md
    for the settings and the efim/* notifications.

    \b
    Example (what an editor runs):
      efim lsp
      efim lsp --socket /tmp/efim-test/efim.sock --log-file /tmp/efim-lsp.log
    """
    import logging

    from ..lsp.server import serve

    logging.basicConfig(filename=log_file, level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not verbose:  # pygls logs every message at INFO: costly on the keystroke path
        logging.getLogger("pygls").setLevel(logging.WARNING)
    serve(sock)
