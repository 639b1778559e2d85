"""Where the cursor settles, for the daemon's ``cursor`` (the plan anchored there is prefilled while
idle, so that the first keystroke there finds its context cached; docs/editors.md).

LSP has no notification for a cursor at rest. Two ways tell this server:

- ``efim/cursor`` ``{uri, position}``: sent by clients that know efim (the VS Code extension, after
  ``efim.cursorDebounceMs`` of rest). They say so at initialize (``cursorNotifications``).
- ``textDocument/documentHighlight``, offered to every other client: editors ask it when the cursor
  rests to highlight the symbol under it (Neovim's ``CursorHold`` in most configurations, Emacs's
  lsp-mode). This server highlights nothing (null: other servers' highlights show; docs/editors.md).

Either is passed on only when the cursor rests on another line than the one the daemon last heard
of for the document (its last completion or cursor note; an edit is no news of the cursor to it):
resting again where nothing moved sends nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from ..errors import EfimError, one_line
from .sync import fs_path

log = logging.getLogger("efim.lsp")
CURSOR = "efim/cursor"


def settled(ls, args: Any) -> None:
    """``efim/cursor``'s params checked (a malformed one raises JsonRpcInvalidParams), then ``rest``."""
    pos = args.get("position") if isinstance(args, dict) else None
    if not isinstance(args.get("uri") if isinstance(args, dict) else None, str) or not isinstance(pos, dict) \
            or not all(type(pos.get(k)) is int for k in ("line", "character")):
        raise JsonRpcInvalidParams("invalid params: expected {uri, position: {line, character}}")
    rest(ls, args["uri"], pos["line"], pos["character"])


def rest(ls, uri: str, line: int, units: int) -> None:
    """The cursor settled at (``line``, ``units``: the client's) of document ``uri``; the daemon hears
    of it unless it rests on the document's last known line. Nothing for a document out of step or
    not enabled; one not open, or a position outside it, raises JsonRpcInvalidParams."""
    doc = ls.docs.get(uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"invalid params: document not open: {uri}")
    if ls.relay is None or not ls.settings.enabled(doc.language) or doc.editor_error or doc.daemon_error:
        return
    try:
        line, col = doc.point(line, units, ls.conv)
    except EfimError as e:  # (a position outside the document)
        raise JsonRpcInvalidParams(one_line(e.message)) from None
    if line == doc.line:
        return
    doc.line = line
    ls.relay.notify("cursor", {"path": fs_path(uri), "position": {"line": line, "character": col}}, sync=True)


def document_highlight(ls, params: t.DocumentHighlightParams) -> None:
    """``textDocument/documentHighlight``: the cursor rests at ``params.position`` (``rest``).
    No highlights: null."""
    try:
        rest(ls, params.text_document.uri, params.position.line, params.position.character)
    except JsonRpcException as e:  # a client that asks for highlights expects no error from a cursor note
        log.warning("efim: %s", e)
    return None


def register(ls) -> None:
    """Offer ``textDocument/documentHighlight`` unless the client sends ``efim/cursor`` (called at
    initialize, before the server's capabilities are computed from its features)."""
    if not ls.settings.cursor_notifications and t.TEXT_DOCUMENT_DOCUMENT_HIGHLIGHT not in ls.protocol.fm.features:
        ls.feature(t.TEXT_DOCUMENT_DOCUMENT_HIGHLIGHT)(document_highlight)  # (once: a second initialize)
