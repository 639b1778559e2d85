"""``efim lsp``: a stdio language server (pygls) that relays to the shared daemon.

- ``textDocument/inlineCompletion`` (LSP 3.18): one item that replaces the typed part of the word
  under the cursor with that part plus efim's completion; a newer request for a document cancels
  the older one (the daemon supersedes it), ``$/cancelRequest`` cancels it in the daemon too.
- Document sync is incremental: this server keeps its own copy of each document (``text.py``) to turn
  the client's position units into the daemon's code points, and forwards each edit as it came.
  The workspace folder that holds a document is sent as its ``root`` (the daemon watches it).
- Notifications to the client: ``efim/status`` after each completion (model, latency, cache tier).
  From the client: ``efim/didPartiallyAcceptCompletion`` (and the ``efim.accepted`` command that the
  item carries, run on a full accept) tell the daemon what was taken (its ``accepted`` method).
- Settings (``initializationOptions``, ``workspace/didChangeConfiguration``; a top-level ``efim``
  object is read too): ``maxTokens``, ``maxLines``, ``enabledLanguages`` (``["*"]``: all),
  ``socket``; ``debounceMs`` and ``efimPath`` belong to the client.
- Errors: a request with bad params, a position outside the document or an unknown document gets an
  LSP error (one line) and the server goes on serving.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcRequestCancelled
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.uris import to_fs_path

from ..errors import CANCELLED, DaemonUnavailable, EfimError, InvalidParams, one_line
from ..request import check_option
from .relay import Relay
from .text import Converter, Doc, columns

log = logging.getLogger("efim.lsp")
STATUS = "efim/status"
PARTIAL_ACCEPT = "efim/didPartiallyAcceptCompletion"
ACCEPTED_COMMAND = "efim.accepted"


def _valid(option: str, v: Any) -> bool:
    """Whether ``v`` is a valid value of a request option (its one definition: efim_local/request.py)."""
    try:
        check_option(option, v)
    except InvalidParams:
        return False
    return True


@dataclass
class Settings:
    max_tokens: int | None = None
    max_lines: int | None = None
    enabled_languages: list[str] = field(default_factory=lambda: ["*"])
    socket: str | None = None

    def update(self, raw: Any) -> None:
        """Take the known keys of a settings object (``{"efim": {...}}`` or flat); bad values are
        ignored with a warning, so that one typo does not turn completion off."""
        if not isinstance(raw, dict):
            return
        raw = raw.get("efim", raw) if isinstance(raw.get("efim"), dict) else raw
        for key, attr, ok in (("maxTokens", "max_tokens", lambda v: _valid("max_tokens", v)),
                              ("maxLines", "max_lines", lambda v: v == 0 or _valid("max_lines", v)),
                              ("enabledLanguages", "enabled_languages",
                               lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
                              ("socket", "socket", lambda v: isinstance(v, str) and v != "")):
            if key in raw and raw[key] is not None:
                if ok(raw[key]):
                    setattr(self, attr, raw[key])
                else:
                    log.warning("efim: ignoring setting %s=%r", key, raw[key])

    def enabled(self, language: str) -> bool:
        return "*" in self.enabled_languages or language in self.enabled_languages


def lsp_error(e: EfimError) -> JsonRpcException:
    if e.code == CANCELLED:
        return JsonRpcRequestCancelled(one_line(e.message))
    return JsonRpcException(one_line(e.message), e.code)


class Protocol(LanguageServerProtocol):
    """pygls' protocol with efim's document sync in place of pygls' own copy of the workspace, and
    an error reply (not just a log line) for a request whose params do not fit their type."""

    _server: "EfimServer"

    @lsp_method(t.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: t.DidOpenTextDocumentParams):
        self._server.did_open(params)

    @lsp_method(t.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: t.DidChangeTextDocumentParams):
        self._server.did_change(params)

    @lsp_method(t.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: t.DidCloseTextDocumentParams):
        self._server.did_close(params)

    def structure_message(self, data: dict):
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            if isinstance(data.get("method"), str) and "id" in data:
                self._send_response(data["id"], error=JsonRpcInvalidParams(
                    f"invalid params for {data['method']}").to_response_error())
                return _IGNORED
            raise e

    def handle_message(self, message):
        if message is not _IGNORED:
            super().handle_message(message)


_IGNORED = object()  # a message already answered with an error


class EfimServer(LanguageServer):
    def __init__(self):
        from .. import __version__

        super().__init__("efim", __version__, protocol_cls=Protocol,
                         text_document_sync_kind=t.TextDocumentSyncKind.Incremental)
        self.settings = Settings()
        self.docs: dict[str, Doc] = {}
        self.roots: list[str] = []
        self.conv = Converter()
        self.relay: Relay | None = None
        self.completion_ids = itertools.count(1)
        self.model: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def initialize(self, params: t.InitializeParams) -> None:
        self.settings.update(params.initialization_options)
        self.conv = Converter(self.workspace.position_encoding or "utf-16")
        for folder in params.workspace_folders or ():
            self.add_root(folder.uri)
        if not params.workspace_folders and params.root_uri:
            self.add_root(params.root_uri)
        self.relay = Relay(self.settings.socket, on_connect=self.replay)

    def add_root(self, uri: str) -> None:
        path = to_fs_path(uri) if uri.startswith("file:") else None
        if path and path not in self.roots:
            self.roots.append(path)

    def root_of(self, path: str) -> str | None:
        best = None
        for r in self.roots:
            if (path == r or path.startswith(r.rstrip("/") + "/")) and (best is None or len(r) > len(best)):
                best = r
        return best

    # -- document sync ------------------------------------------------------------------------
    @staticmethod
    def path(uri: str) -> str:
        return (to_fs_path(uri) if uri.startswith("file:") else None) or uri

    def sync(self, method: str, params: dict, uri: str) -> None:
        """Send a document notification as a request: when the daemon rejects an edit (its copy
        went astray), it gets the whole text again."""
        if self.relay is None:
            return
        _, fut = self.relay.request(method, params, sync=True)
        fut.add_done_callback(lambda f: self.resync(uri, f))

    def resync(self, uri: str, fut: asyncio.Future) -> None:
        err = fut.exception() if not fut.cancelled() else None
        if isinstance(err, InvalidParams) and uri in self.docs:
            log.warning("efim: resyncing %s (%s)", uri, err)
            self.relay.request("didOpen", self.open_params(uri), sync=True)[1].add_done_callback(_quiet)

    def open_params(self, uri: str) -> dict:
        doc, path = self.docs[uri], self.path(uri)
        p = {"path": path, "text": doc.text, "version": doc.version}
        root = self.root_of(path)
        if root:
            p["root"] = root
        return p

    def replay(self) -> None:
        """A new daemon connection: open every document again (the daemon may have restarted)."""
        for uri in self.docs:
            self.relay.request("didOpen", self.open_params(uri))[1].add_done_callback(_quiet)

    def did_open(self, params: t.DidOpenTextDocumentParams) -> None:
        td = params.text_document
        self.docs[td.uri] = Doc(td.text, td.version, td.language_id)
        self.sync("didOpen", self.open_params(td.uri), td.uri)

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
                    start = doc.point(ch.range.start.line, ch.range.start.character, self.conv)
                    end = doc.point(ch.range.end.line, ch.range.end.character, self.conv)
                    doc.apply(start, end, ch.text)
                    changes.append({"range": {"start": {"line": start[0], "character": start[1]},
                                              "end": {"line": end[0], "character": end[1]}}, "text": ch.text})
                else:
                    doc.replace(ch.text)
                    changes.append({"text": ch.text})
        except EfimError as e:  # a notification cannot be answered: keep what applied, resync
            log.warning("efim: bad change to %s: %s", uri, e)
            doc.version = params.text_document.version
            self.sync("didOpen", self.open_params(uri), uri)
            return
        doc.version = params.text_document.version
        self.sync("didChange", {"path": self.path(uri), "version": doc.version, "contentChanges": changes}, uri)

    def did_close(self, params: t.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        if self.docs.pop(uri, None) is not None and self.relay is not None:
            self.relay.notify("didClose", {"path": self.path(uri)}, sync=True)

    # -- completion -----------------------------------------------------------------------------
    async def inline_completion(self, params: t.InlineCompletionParams) -> t.InlineCompletionList | None:
        received = time.perf_counter()
        if self.relay is None:
            raise JsonRpcException("server not initialized", -32002)
        uri = params.text_document.uri
        doc = self.docs.get(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"invalid params: document not open: {uri}")
        if not self.settings.enabled(doc.language):
            return t.InlineCompletionList(items=[])
        try:
            line, col = doc.point(params.position.line, params.position.character, self.conv)
        except EfimError as e:
            raise lsp_error(e) from None
        # the item replaces the word typed so far (from this text: the document may change meanwhile)
        cols = columns(doc.lines[line])
        start = doc.word_start(line, col)
        rng = t.Range(start=t.Position(line, self.conv.to_units(cols, start)),
                      end=t.Position(line, self.conv.to_units(cols, col)))
        typed = cols[start:col]
        p: dict[str, Any] = {"path": self.path(uri), "position": {"line": line, "character": col}}
        if self.settings.max_tokens is not None:
            p["max_tokens"] = self.settings.max_tokens
        if self.settings.max_lines:
            p["max_lines"] = self.settings.max_lines
        started = time.perf_counter()
        result = await self.complete(p)
        answered = time.perf_counter()
        self.status(result, (answered - received) * 1000, (answered - started) * 1000)
        text = result.get("text") or ""
        if not text:
            return t.InlineCompletionList(items=[])
        cid = f"{next(self.completion_ids)}"
        item = t.InlineCompletionItem(
            insert_text=typed + text, range=rng,
            command=t.Command(title="efim: accepted", command=ACCEPTED_COMMAND,
                              arguments=[{"uri": uri, "id": cid, "text": text}]))
        return t.InlineCompletionList(items=[item])

    async def complete(self, params: dict) -> dict:
        """The daemon's ``complete``. A newer one for the same path supersedes it (cancel-previous);
        when the daemon went away meanwhile (a restart), it is asked again once, after the relay
        reconnected and opened the documents again."""
        for attempt in (0, 1):
            rid, fut = self.relay.request("complete", params)
            try:
                return await fut
            except asyncio.CancelledError:  # $/cancelRequest
                self.relay.notify("cancel", {"id": rid})
                raise
            except DaemonUnavailable as e:
                if attempt or self.relay.error is not None:  # not a dropped connection: no daemon at all
                    raise lsp_error(e) from None
                log.warning("efim: %s; asking again", e)
            except EfimError as e:
                raise lsp_error(e) from None
        raise AssertionError("unreachable")

    def status(self, result: dict, latency_ms: float, daemon_rtt_ms: float) -> None:
        """``latency_ms``: from the request's arrival here to its answer; ``daemon_rtt_ms``: the
        daemon's round trip within it; ``daemon_ms``: the engine's own time."""
        self.protocol.notify(STATUS, {
            "model": self.model, "latency_ms": round(latency_ms, 3), "daemon_rtt_ms": round(daemon_rtt_ms, 3),
            "daemon_ms": (result.get("timings") or {}).get("total_ms"),
            "cache_tier": result.get("cache_tier"), "tokens": result.get("tokens"), "context": result.get("context"),
            "stop_reason": result.get("stop_reason")})

    async def fetch_model(self) -> None:
        try:
            st = await self.relay.call("status", {})
            self.model = st.get("model")
        except EfimError as e:
            self.show_message(f"efim: {one_line(str(e))}", t.MessageType.Warning)

    def show_message(self, text: str, kind: t.MessageType) -> None:
        self.window_show_message(t.ShowMessageParams(type=kind, message=text))

    # -- accepted completions -------------------------------------------------------------------
    async def accepted(self, args: Any, full: bool) -> None:
        """Tell the daemon what the user took of a completion (all of it, or ``acceptedLength``)."""
        if not isinstance(args, dict) or not isinstance(args.get("uri"), str) \
                or not isinstance(args.get("text"), str):
            raise JsonRpcInvalidParams("invalid params: expected {uri, id, text, acceptedLength}")
        text = args["text"]
        n = len(text) if full else args.get("acceptedLength")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(text):
            raise JsonRpcInvalidParams(f"invalid params: acceptedLength must be in [0, {len(text)}]")
        if self.relay is None:
            raise JsonRpcException("server not initialized", -32002)
        cid = args.get("id")
        p = {"path": self.path(args["uri"]), "id": str(cid) if cid is not None else "", "text": text,
             "accepted": n}
        try:
            await self.relay.call("accepted", p)
        except EfimError as e:
            raise lsp_error(e) from None


def _quiet(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a failed replay is logged by the relay already


def build() -> EfimServer:
    """The server with its features registered (``serve`` runs it)."""
    ls = EfimServer()

    @ls.feature(t.INITIALIZE)
    def initialize(ls: EfimServer, params: t.InitializeParams):
        ls.initialize(params)

    @ls.feature(t.INITIALIZED)
    async def initialized(ls: EfimServer, params: t.InitializedParams):
        await ls.fetch_model()

    @ls.feature(t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionOptions())
    async def inline_completion(ls: EfimServer, params: t.InlineCompletionParams):
        try:
            return await ls.inline_completion(params)
        except (JsonRpcException, asyncio.CancelledError):
            raise
        except Exception as e:  # a bug: logged here, one line on the wire
            log.exception("inline completion failed")
            raise JsonRpcException(one_line(f"internal error: {e.__class__.__name__}: {e}"), -32603) from None

    @ls.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: EfimServer, params: t.DidChangeConfigurationParams):
        ls.settings.update(params.settings)

    @ls.feature(t.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_folders(ls: EfimServer, params: t.DidChangeWorkspaceFoldersParams):
        for f in params.event.removed:
            path = to_fs_path(f.uri)
            if path in ls.roots:
                ls.roots.remove(path)
        for f in params.event.added:
            ls.add_root(f.uri)

    @ls.feature(PARTIAL_ACCEPT)
    async def partial_accept(ls: EfimServer, params: Any):
        try:
            await ls.accepted(plain(params), full=False)
        except JsonRpcException as e:  # a notification: nobody to answer
            log.warning("efim: %s", e)

    @ls.command(ACCEPTED_COMMAND)
    async def accepted(ls: EfimServer, *args):
        await ls.accepted(plain(args[0]) if len(args) == 1 else None, full=True)

    return ls


def plain(obj: Any) -> Any:
    """Params of a custom method as plain JSON values (pygls hands over named tuples)."""
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


class _ExpectedErrors(logging.Filter):
    """pygls logs a traceback for every error reply; ours are expected, and have one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], JsonRpcException))


def serve(socket: str | None = None) -> None:
    """Run the server on stdin/stdout until the client exits."""
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_ExpectedErrors())
    ls = build()
    if socket:
        ls.settings.socket = socket
    ls.start_io()
