"""``efim lsp``: a stdio language server (pygls) that relays to the shared daemon.

- ``textDocument/inlineCompletion`` (LSP 3.18): one item that replaces the typed part of the word
  under the cursor with that part plus efim's completion; a newer request for a document cancels
  the older one (the daemon supersedes it), ``$/cancelRequest`` cancels it in the daemon too.
- Document sync is incremental: this server keeps its own copy of each document (``text.py``) to turn
  the client's position units into the daemon's code points, and forwards each edit as it came
  (``sync.py``: a refused edit makes the document's completions fail with the reason, never answer
  for older text). The workspace folder that holds a document is sent as its ``root``.
- Notifications to the client: ``efim/status`` after each completion (model, latency, cache tier).
  From the client: ``efim/didPartiallyAcceptCompletion`` (and the ``efim.accepted`` command that the
  item carries, run on a full accept) tell the daemon what was taken (its ``accepted`` method);
  ``efim/definitions`` (``{uri, definitions: [{uri, line}]}``: where the editor's language servers
  define the names a document imports) goes to the daemon's ``definitions`` (repository context);
  ``efim/cursor`` (``{uri, position}``: the cursor settled there; for other clients the position of
  each ``textDocument/documentHighlight``) to its ``cursor``, so that the plan anchored there is
  prefilled before the first keystroke (``cursor.py``).
- Settings (``initializationOptions``, ``workspace/didChangeConfiguration``; a top-level ``efim``
  object is read too): ``maxTokens``, ``maxLines``, ``enabledLanguages`` (``["*"]``: all),
  ``socket``, ``cursorNotifications`` (at initialize: the client sends ``efim/cursor``);
  ``debounceMs`` and ``efimPath`` belong to the client.
- Errors: a request with bad params, a position outside the document or an unknown document gets an
  LSP error (one line) and the server goes on serving.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from typing import Any

from cattrs import ClassValidationError, transform_error
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcRequestCancelled
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.uris import to_fs_path

from ..errors import CANCELLED, DaemonUnavailable, EfimError, one_line
from ..prompt.windows import CLOSERS, MAX_CLOSERS
from . import cursor
from .relay import Relay
from .settings import Settings
from .sync import Sync, fs_path
from .text import Converter, columns

log = logging.getLogger("efim.lsp")
STATUS = "efim/status"
PARTIAL_ACCEPT = "efim/didPartiallyAcceptCompletion"
DEFINITIONS = "efim/definitions"
ACCEPTED_COMMAND = "efim.accepted"


def lsp_error(e: EfimError) -> JsonRpcException:
    if e.code == CANCELLED:
        return JsonRpcRequestCancelled(one_line(e.message))
    return JsonRpcException(one_line(e.message), e.code)


def replaced(result: dict, cols: str, col: int) -> int | None:
    """How many columns after the cursor the daemon's answer replaces (its ``replaces``: the closers
    it typed over); None when that is not a count of closers there (the answer is not shown)."""
    n = result.get("replaces", 0)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_CLOSERS:
        return None
    return n if all(c in CLOSERS for c in cols[col:col + n]) and col + n <= len(cols) else None


class Protocol(LanguageServerProtocol):
    """pygls' protocol with efim's document sync in place of pygls' own copy of the workspace, and
    an error reply (not just a log line) for a request whose params do not fit their type."""

    _server: "EfimServer"

    @lsp_method(t.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: t.DidOpenTextDocumentParams):
        self._server.sync.did_open(params)

    @lsp_method(t.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: t.DidChangeTextDocumentParams):
        self._server.sync.did_change(params)

    @lsp_method(t.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: t.DidCloseTextDocumentParams):
        self._server.sync.did_close(params)

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
        self.sync = Sync(self)
        self.docs = self.sync.docs
        self.roots: list[str] = []
        self.conv = Converter()
        self.relay: Relay | None = None
        self.completion_ids = itertools.count(1)
        self.model: str | None = None
        self.definitions_of: dict[str, dict] = {}  # uri -> the last `definitions` params (sent again to a new daemon)

    # -- lifecycle ----------------------------------------------------------------------------
    def initialize(self, params: t.InitializeParams) -> None:
        self.settings.update(params.initialization_options)
        self.conv = Converter(self.workspace.position_encoding or "utf-16")
        for folder in params.workspace_folders or ():
            self.add_root(folder.uri)
        if not params.workspace_folders and params.root_uri:
            self.add_root(params.root_uri)
        self.relay = Relay(self.settings.socket, on_connect=self.sync.replay, on_start_failed=self.start_failed)
        cursor.register(self)  # documentHighlight, for clients that send no efim/cursor

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
        self.sync.check(doc)
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
        # the version: the daemon refuses to complete any other text (a refused edit, a lost one)
        # type_over: the answer may go on past the closers the editor's auto-pairs put after the cursor
        # (`f(|)`: `x)`, not `x`); the item's range then covers the closers it replaces
        p: dict[str, Any] = {"path": fs_path(uri), "position": {"line": line, "character": col}, "version": doc.version,
                             "type_over": True}
        if self.settings.max_tokens is not None:
            p["max_tokens"] = self.settings.max_tokens
        if self.settings.max_lines:
            p["max_lines"] = self.settings.max_lines
        started = time.perf_counter()
        try:
            result = await self.complete(p)
        except JsonRpcException as e:
            self.sync.check(doc, e)  # the reason behind the daemon's refusal, when there is one
            raise
        answered = time.perf_counter()
        doc.line = line  # (the daemon's anchor now: a cursor resting here needs no note, cursor.py)
        self.status(result, (answered - received) * 1000, (answered - started) * 1000)
        text = result.get("text") or ""
        over = replaced(result, cols, col)
        if not text or over is None:
            return t.InlineCompletionList(items=[])
        if over:
            rng.end = t.Position(line, self.conv.to_units(cols, col + over))
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
            "stop_reason": result.get("stop_reason"), "source": result.get("source")})

    async def fetch_model(self) -> None:
        try:
            st = await self.relay.call("status", {})
            self.model = st.get("model")
        except EfimError as e:
            self.show_message(f"efim: {one_line(str(e))}", t.MessageType.Warning)

    def start_failed(self, reason: str) -> None:
        """The daemon could not be started (the relay tries again later): say why, once per try."""
        self.show_message(f"efim: the daemon could not be started: {reason}", t.MessageType.Error)

    def show_message(self, text: str, kind: t.MessageType) -> None:
        self.window_show_message(t.ShowMessageParams(type=kind, message=text))

    # -- the editor's definitions ----------------------------------------------------------------
    async def definitions(self, args: Any) -> None:
        """Where the editor's language servers define the names a document imports, to the daemon."""
        locs = args.get("definitions") if isinstance(args, dict) else None
        if not isinstance(args.get("uri") if isinstance(args, dict) else None, str) or not isinstance(locs, list) \
                or not all(isinstance(d, dict) and isinstance(d.get("uri"), str) for d in locs):
            raise JsonRpcInvalidParams("invalid params: expected {uri, definitions: [{uri, line}]}")
        if self.relay is None:
            raise JsonRpcException("server not initialized", -32002)
        p = {"path": fs_path(args["uri"]),
             "definitions": [{"path": fs_path(d["uri"]), "line": d.get("line")} for d in locs]}
        self.definitions_of.pop(args["uri"], None)
        self.definitions_of[args["uri"]] = p
        while len(self.definitions_of) > 256:
            self.definitions_of.pop(next(iter(self.definitions_of)))
        try:
            await self.relay.call("definitions", p)
        except EfimError as e:
            raise lsp_error(e) from None

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
        p = {"path": fs_path(args["uri"]), "id": str(cid) if cid is not None else "", "text": text,
             "accepted": n}
        try:
            await self.relay.call("accepted", p)
        except EfimError as e:
            raise lsp_error(e) from None


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

    @ls.feature(DEFINITIONS)
    async def definitions(ls: EfimServer, params: Any):
        try:
            await ls.definitions(plain(params))
        except JsonRpcException as e:  # a notification: nobody to answer
            log.warning("efim: %s", e)

    @ls.feature(cursor.CURSOR)
    def cursor_settled(ls: EfimServer, params: Any):
        try:
            cursor.settled(ls, plain(params))
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
    """pygls logs a traceback for every error reply; ours are expected, and have one line. So has a
    message whose params do not fit their type (answered InvalidParams: ``Protocol``): where and why."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], JsonRpcException):
            return False
        exc = sys.exc_info()[1]  # (pygls logs it in its except block, the traceback as text)
        if isinstance(exc, ClassValidationError) and isinstance(record.msg, str) \
                and record.msg.startswith("Unable to deserialize message"):
            record.msg, record.args = "Unable to deserialize message: %s", ("; ".join(transform_error(exc)),)
        return True


def serve(socket: str | None = None) -> None:
    """Run the server on stdin/stdout until the client exits."""
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_ExpectedErrors())
    from .stdio import start_io

    ls = build()
    if socket:
        ls.settings.socket = socket
    start_io(ls)  # efim's reader: a bad frame costs only itself
