"""The LSP server's document sync: its copy of each editor document, and whether the daemon's copy
and its own are still the editor's.

Edits go to the daemon as they came (incremental), each as a request, so that a refusal comes back.
A copy goes out of step two ways, and completions of that document then fail with the reason
(the editor is also warned once) rather than answer for a text the editor no longer has:

- The daemon refuses an edit (over 8 MiB, a lone surrogate, a range its copy lacks): it keeps
  older text. The whole text is sent again at once (``didOpen``), and with each later edit until
  the daemon takes it.
- An edit from the editor cannot be applied here (a range outside the document): this copy is not
  the editor's. It stays out of step until the editor sends the whole text (didOpen or a full change).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pygls.uris import to_fs_path

from ..errors import INVALID_PARAMS, DaemonUnavailable, EfimError, one_line
from .text import Doc

log = logging.getLogger("efim.lsp")


def fs_path(uri: str) -> str:
    """The daemon's name for a document: its file path, else the URI itself."""
    return (to_fs_path(uri) if uri.startswith("file:") else None) or uri


class Sync:
    """Open documents by URI. ``server`` gives the relay (``server.relay``), the workspace roots
    (``root_of``) and the warnings to the editor (``show_message``)."""

    def __init__(self, server):
        self.server = server
        self.docs: dict[str, Doc] = {}
        self.seq = itertools.count(1)  # each sync message's number, in sending order

    # -- what the daemon is told -------------------------------------------------------------
    def open_params(self, uri: str) -> dict:
        doc, path = self.docs[uri], fs_path(uri)
        p = {"path": path, "text": doc.text, "version": doc.version}
        root = self.server.root_of(path)
        if root:
            p["root"] = root
        return p

    def send(self, uri: str, method: str, params: dict, full: bool, sync: bool = True) -> None:
        """Send a document message as a request; ``full``: it carries the whole text. ``sync``:
        answered without being sent when a new connection replays the documents."""
        relay, doc = self.server.relay, self.docs[uri]
        if relay is None:
            return
        seq = next(self.seq)
        if full:
            doc.full_seq = seq
        _, fut = relay.request(method, params, sync=sync)
        fut.add_done_callback(lambda f: self.answered(uri, doc, seq, full, f))

    def answered(self, uri: str, doc: Doc, seq: int, full: bool, fut: asyncio.Future) -> None:
        """The daemon's answer to sync message ``seq``: in step again after the whole text was
        taken; out of step when it refused one (unless a whole text sent since decides)."""
        if fut.cancelled() or self.docs.get(uri) is not doc:
            return
        err = fut.exception()
        if full:
            doc.full_answered = max(doc.full_answered, seq)
        if err is None:
            if full and seq == doc.full_seq:
                doc.daemon_error = None
            return
        if isinstance(err, DaemonUnavailable) or not isinstance(err, EfimError) or seq < doc.full_seq:
            return  # a reconnection replays the whole text; a later whole text decides
        reason = one_line(str(err))
        log.warning("efim: the daemon refused %s: %s", uri, reason)
        if doc.daemon_error is None:
            self.server.show_message(f"efim: {os.path.basename(fs_path(uri))}: {reason}; no completions for it "
                                     "until the daemon takes its text", t.MessageType.Warning)
        doc.daemon_error = reason
        if not full:  # its copy went astray (or an edit was too large): the whole text, once
            self.send(uri, "didOpen", self.open_params(uri), full=True)

    def replay(self) -> None:
        """A new daemon connection: open every document again (the daemon may have restarted), and
        send the editor's definitions of each again."""
        for uri, doc in self.docs.items():
            doc.line = None  # (a new daemon knows no cursor; a note lost with the old connection)
            self.send(uri, "didOpen", self.open_params(uri), full=True, sync=False)
            defs = self.server.definitions_of.get(uri)
            if defs is not None and self.server.relay is not None:
                self.server.relay.request("definitions", defs, sync=False)

    # -- the editor's notifications ----------------------------------------------------------
    def did_open(self, params: t.DidOpenTextDocumentParams) -> None:
        td = params.text_document
        self.docs[td.uri] = Doc(td.text, td.version, td.language_id)
        self.send(td.uri, "didOpen", self.open_params(td.uri), full=True)

    def did_change(self, params: t.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        doc = self.docs.get(uri)
        if doc is None:
            log.warning("efim: change to a document that is not open: %s", uri)
            return
        changes = []
        try:
            for ch in params.content_changes:
                if isinstance(ch, t.TextDocumentContentChangePartial):
                    start = doc.point(ch.range.start.line, ch.range.start.character, self.server.conv)
                    end = doc.point(ch.range.end.line, ch.range.end.character, self.server.conv)
                    doc.apply(start, end, ch.text)
                    changes.append({"range": {"start": {"line": start[0], "character": start[1]},
                                              "end": {"line": end[0], "character": end[1]}}, "text": ch.text})
                else:
                    doc.replace(ch.text)
                    doc.editor_error = None  # the editor's whole text: this copy is the editor's again
                    changes.append({"text": ch.text})
        except EfimError as e:  # a notification cannot be answered: keep what applied, say so
            reason = one_line(str(e))
            log.warning("efim: bad change to %s: %s", uri, reason)
            if doc.editor_error is None:
                self.server.show_message(f"efim: {os.path.basename(fs_path(uri))}: an edit could not be applied "
                                         f"({reason}); no completions for it until it is reopened",
                                         t.MessageType.Warning)
            doc.editor_error = reason
            changes = None
        doc.version = params.text_document.version
        if changes is None or doc.daemon_error is not None:
            self.send(uri, "didOpen", self.open_params(uri), full=True)
        else:
            self.send(uri, "didChange", {"path": fs_path(uri), "version": doc.version, "contentChanges": changes},
                      full=False)

    def did_close(self, params: t.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        if self.docs.pop(uri, None) is not None and self.server.relay is not None:
            self.server.relay.notify("didClose", {"path": fs_path(uri)}, sync=True)

    def lost(self, data: bytes, reason: str) -> None:
        """An unreadable message from the editor (``data``: its first bytes) was a document
        message: the documents it names, or all when none can be told, are out of step."""
        named = [uri for uri in self.docs if json.dumps(uri).encode() in data]
        for uri in named or list(self.docs):
            doc = self.docs[uri]
            if doc.editor_error is None:
                self.server.show_message(f"efim: {os.path.basename(fs_path(uri))}: an edit from the editor was lost "
                                         f"({reason}); no completions for it until it is reopened",
                                         t.MessageType.Warning)
            doc.editor_error = f"an edit was lost: {reason}"

    # -- completions -------------------------------------------------------------------------
    def check(self, doc: Doc, err: JsonRpcException | None = None) -> None:
        """Raise the LSP error that says why ``doc`` cannot be completed, if it is out of step.
        Before a request (no ``err``), a whole text on its way to the daemon may bring it back in
        step: the daemon, which gets it first, decides. After the daemon's error ``err`` (then only
        a consequence: a version it lacks), the reason is the refusal's."""
        if doc.editor_error is not None:
            raise JsonRpcException(f"efim: this document is out of step with the editor ({doc.editor_error}); "
                                   "reopen it", INVALID_PARAMS)
        if doc.daemon_error is not None and (err is not None or doc.full_answered >= doc.full_seq):
            code = err.code if err is not None else INVALID_PARAMS
            raise JsonRpcException(f"efim: the daemon refused this document's text: {doc.daemon_error}", code)
