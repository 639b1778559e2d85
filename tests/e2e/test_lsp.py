"""`efim lsp` over stdio, driven by a real LSP client (pytest-lsp), relaying to a real daemon on the
tiny model: initialize, open, inline completion, incremental change, cancel, partial accept,
shutdown, and errors that leave the server serving."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient, client_capabilities, make_test_lsp_client

from efim_local.engine.completion import SOURCES
from efim_local.errors import CANCELLED, INVALID_PARAMS, REQUEST_TOO_LARGE
from efim_local.lsp.server import plain

from tests.helpers import ROOT, Daemon, Relay, neovims, wait_until

URI = "file:///work/proj/app.py"
# Greek letters are one UTF-16 unit, the emoji two: LSP columns differ from the daemon's code points.
TEXT = "def greet(name):\n    s = 'αβ 😀 ' + name\n    return s\n\nx = gre"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_model):
    d = Daemon(tmp_path_factory.mktemp("lsp-daemon"), tiny_model).start()
    yield d
    d.stop()


async def start_client(env: dict, *args: str, init: dict | None = None, folders=("file:///work/proj",)
                       ) -> LanguageClient:
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "efim_local.cli", "lsp", *args, env=env, cwd=str(ROOT))
    status: list = []
    client.efim_status = status
    client.feature("efim/status")(lambda params: status.append(plain(params)))
    result = await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=init or {"maxTokens": 6},
        workspace_folders=[t.WorkspaceFolder(uri=f, name="proj") for f in folders]))
    client.server_capabilities = result.capabilities
    return client


@pytest_asyncio.fixture
async def client(daemon):
    c = await start_client(daemon.env, "--socket", str(daemon.sock))
    yield c
    await c.shutdown_session()
    await c.stop()


def open_doc(client, text=TEXT, uri=URI, language="python", version=1):
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))


def inline(client, line, character, uri=URI, msg_id=None):
    """Send an inline completion request now; returns the future of its answer."""
    return asyncio.wrap_future(client.protocol.send_request(t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line, character),
        context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic)), msg_id=msg_id))


def raw_request(client, method, params):
    """A request with params as given (pygls' client would refuse to build a malformed one)."""
    mid = f"raw-{id(params)}"
    fut = concurrent.futures.Future()
    client.protocol._request_futures[mid] = fut
    client.protocol._send_data({"jsonrpc": "2.0", "id": mid, "method": method, "params": params})
    return asyncio.wrap_future(fut)


def edit(client, version, start, end, text, uri=URI):
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(t.Position(*start), t.Position(*end)), text=text)]))


def daemon_agrees(daemon, text, line, character, got, path="/work/proj/app.py", max_tokens=6, **opts):
    """The daemon completes ``text`` at the same place of the same file as the LSP's request did, with
    no re-anchoring (its synced copy was exactly ``text``), to the same text; returns its result.
    ``daemon``: a Daemon or a socket path; ``opts``: more options of the request."""
    from efim_local.daemon.client import Client

    with Client(getattr(daemon, "sock", daemon)) as c:
        res = c.call("complete", {"path": path, "text": text, "position": {"line": line, "character": character},
                                  "max_tokens": max_tokens, **opts})
    assert res["reanchor"] is None and res["text"] == got, res
    return res


@pytest.mark.asyncio
async def test_initialize_open_complete_and_word_range(client, daemon):
    res = client.capabilities  # what we sent; the server's answer is checked through its behaviour
    assert res is not None
    open_doc(client)
    got = await inline(client, 4, 7)  # after "x = gre"
    assert len(got.items) == 1
    item = got.items[0]
    # The item replaces the typed part of the word ("gre") with that part plus efim's text.
    assert item.range == t.Range(t.Position(4, 4), t.Position(4, 7))
    want = item.insert_text[3:]
    assert item.insert_text.startswith("gre") and want and daemon_agrees(daemon, TEXT, 4, 7, want)
    assert item.command.command == "efim.accepted" and item.command.arguments[0]["text"] == want
    # the status notification: model, latency, cache tier
    st = client.efim_status[-1]
    assert st["model"].endswith("tiny.gguf") and st["latency_ms"] > 0 and st["cache_tier"] in ("slot", "ram", "disk", "none")
    assert st["source"] in SOURCES
    assert st["context"]["tokens"] > 0 and st["context"]["share"] == 1.0  # the context the answer used


@pytest.mark.asyncio
async def test_incremental_changes_convert_utf16_columns(client, daemon):
    open_doc(client)
    # Line 1 is "    s = 'αβ 😀 ' + name": the emoji is 2 UTF-16 units, so code point 14 (after "😀 ")
    # is UTF-16 column 15. Insert "ok" there, then type on line 4 and complete.
    edit(client, 2, (1, 15), (1, 15), "ok")
    edit(client, 3, (4, 7), (4, 7), "e")
    edit(client, 4, (4, 8), (4, 8), "t(")
    got = await inline(client, 4, 10)
    text = TEXT.replace("😀 ", "😀 ok").replace("x = gre", "x = greet(")
    daemon_agrees(daemon, text, 4, 10, got.items[0].insert_text)  # "(" ends no word: an empty range
    assert got.items[0].range == t.Range(t.Position(4, 10), t.Position(4, 10))
    # a completion right after the emoji: the range's start is in UTF-16 units
    edit(client, 5, (1, 17), (1, 17), "ab")
    got = await inline(client, 1, 19)
    assert got.items[0].range.start == t.Position(1, 15)  # the word "okab"
    assert got.items[0].insert_text.startswith("okab")
    text = text.replace("😀 ok", "😀 okab")
    daemon_agrees(daemon, text, 1, 18, got.items[0].insert_text[4:])  # code point 18 = UTF-16 column 19
    with daemon.client() as c:
        st = c.call("status")
    assert st["errors"] == 0


@pytest.mark.asyncio
async def test_newer_request_cancels_older_and_cancel_request(client, daemon):
    doc = "import os\n" * 400 + "def f(x):\n    return "
    open_doc(client, text=doc)
    first = inline(client, 401, 11)
    second = inline(client, 401, 11)  # cancels the first (the daemon supersedes it)
    with pytest.raises(JsonRpcException) as e:
        await first
    assert e.value.code == CANCELLED
    assert len((await second).items) == 1
    # $/cancelRequest: answered RequestCancelled, and the daemon cancels its request too
    edit(client, 2, (0, 0), (0, 0), "import sys\n" * 300)
    # The cancel goes right behind the request (pygls writes in call order, no yield between): the
    # server reads it next, while the daemon still prefills the 700 edited lines.
    third = inline(client, 701, 11, msg_id="third")
    client.protocol.notify("$/cancelRequest", t.CancelParams(id="third"))
    with pytest.raises(JsonRpcException) as e:
        await third
    assert e.value.code == CANCELLED
    assert len((await inline(client, 701, 11)).items) == 1  # and it goes on serving
    with daemon.client() as c:
        assert c.call("status")["errors"] == 0


@pytest_asyncio.fixture
async def healing(tmp_path, tiny_model):
    """A daemon that heals (the random-weight model then mostly answers a typed ``(`` with its ``()``
    token: a ``)`` to type over) and a client of it."""
    d = Daemon(tmp_path / "healing", tiny_model, heal=True).start()
    c = await start_client(d.env, "--socket", str(d.sock))
    yield c, d
    await c.shutdown_session()
    await c.stop()
    d.stop()


@pytest.mark.asyncio
async def test_an_answer_that_types_over_an_auto_paired_closer_replaces_it(healing):
    """Typing ``(`` makes the editor put ``)`` after the cursor. An answer that goes on past that
    closer (``type_over``) comes as an item whose range covers it; the others' range ends at the
    cursor. The daemon, asked the same, gives that text and says it replaces one character."""
    import re

    from efim_local.prompt.windows import MAX_CLOSERS, line_closers
    from tests.helpers import sources

    client, daemon = healing
    src = sources()[0][:3000]
    found = 0
    for k, at in enumerate([m.end() - 1 for m in re.finditer(r"\b[a-z_]+\(", src)][5::7][:12]):
        uri, text = f"file:///work/proj/over{k}.py", src[:at] + src[at + 1:]  # the call's "(" not typed yet
        line, col = text.count("\n", 0, at), at - text.rfind("\n", 0, at) - 1
        open_doc(client, text, uri)
        await inline(client, line, col, uri)  # (the anchor)
        edit(client, 2, (line, col), (line, col), "()", uri)
        item = (await inline(client, line, col + 1, uri)).items
        if not item:
            continue
        own = line_closers(text[at:])  # the closers that ended the line already (an outer call's) follow
        closers = ")" + own if len(own) < MAX_CLOSERS else ")"
        over = item[0].range.end.character - (col + 1)
        assert item[0].range.start == t.Position(line, col + 1) and 0 <= over <= len(closers)
        res = daemon_agrees(daemon, text[:at] + "()" + text[at:], line, col + 1, item[0].insert_text,
                            path=f"/work/proj/over{k}.py", type_over=True)
        assert res.get("replaces", 0) == over and res["context"]["closers"] == closers
        found += over
    assert found, "no answer typed over its closer"


@pytest.mark.asyncio
async def test_partial_and_full_accept_reach_the_daemon(client, daemon):
    with daemon.client() as c:
        before = c.call("status")["accepted"]
    open_doc(client)
    item = (await inline(client, 4, 7)).items[0]
    args = plain(item.command.arguments[0])
    client.protocol.notify("efim/didPartiallyAcceptCompletion", {**args, "acceptedLength": 1})
    await client.workspace_execute_command_async(t.ExecuteCommandParams(command="efim.accepted", arguments=[args]))
    with daemon.client() as c:
        after = c.call("status")["accepted"]
    n = len(args["text"])
    assert after["partial"] == before["partial"] + 1 and after["completions"] == before["completions"] + 1
    assert after["accepted_chars"] - before["accepted_chars"] == 1 + n
    assert after["offered_chars"] - before["offered_chars"] == 2 * n
    with pytest.raises(JsonRpcException) as e:  # more accepted than offered
        await client.workspace_execute_command_async(t.ExecuteCommandParams(
            command="efim.accepted", arguments=[{"uri": URI, "text": "ab", "acceptedLength": 3}, 2]))
    assert e.value.code == INVALID_PARAMS


@pytest.mark.asyncio
async def test_definitions_from_the_editor_reach_the_daemon(client, daemon):
    """``efim/definitions``: where the editor's language servers define a document's imported names
    goes to the daemon as paths; a malformed one is dropped and the server serves on."""
    with daemon.client() as c:
        before = c.call("status")["definitions"]
    open_doc(client)
    client.protocol.notify("efim/definitions", {"uri": URI, "definitions": "nope"})
    client.protocol.notify("efim/definitions", {"uri": URI, "definitions": [
        {"uri": "file:///src/pkg/geometry.py", "line": 3}, {"uri": "file:///src/pkg/util.py", "line": 0}]})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with daemon.client() as c:
            after = c.call("status")["definitions"]
        if after["messages"] > before["messages"]:
            break
        await asyncio.sleep(0.05)
    assert after == {"messages": before["messages"] + 1, "locations": before["locations"] + 2}
    assert (await inline(client, 4, 7)).items  # still serving


@pytest.mark.asyncio
async def test_malformed_and_out_of_range_requests_get_errors(client):
    open_doc(client)
    with pytest.raises(JsonRpcException) as e:
        await inline(client, 99, 0)
    assert e.value.code == INVALID_PARAMS and "outside the document" in e.value.message
    with pytest.raises(JsonRpcException) as e:  # not a uinteger: the params do not even parse
        await raw_request(client, t.TEXT_DOCUMENT_INLINE_COMPLETION, {
            "textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}, "context": {"triggerKind": 1}})
    assert e.value.code == INVALID_PARAMS
    with pytest.raises(JsonRpcException) as e:
        await inline(client, 0, 0, uri="file:///nowhere.py")
    assert e.value.code == INVALID_PARAMS and "not open" in e.value.message
    # params that do not fit the method's type at all
    with pytest.raises(JsonRpcException) as e:
        await raw_request(client, t.TEXT_DOCUMENT_INLINE_COMPLETION, {"textDocument": 5})
    assert e.value.code == INVALID_PARAMS
    # an edit outside the document: the server goes on, but its copy is not the editor's any more:
    # the document's completions fail (issue 27 item 9) until the editor sends its whole text
    edit(client, 2, (50, 0), (50, 0), "zzz")
    with pytest.raises(JsonRpcException) as e:
        await inline(client, 4, 7)
    assert e.value.code == INVALID_PARAMS and "out of step with the editor" in e.value.message
    assert any("an edit could not be applied" in m.message for m in client.messages)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=URI, version=3),
        content_changes=[t.TextDocumentContentChangeWholeDocument(text=TEXT)]))
    got = await inline(client, 4, 7)
    assert got.items[0].range.start == t.Position(4, 4)


@pytest.mark.asyncio
async def test_an_edit_the_daemon_refuses_is_never_completed_as_older_text(client, daemon):
    """Issue 27 item 9: the daemon refuses an edit (a lone surrogate; 9 MB): the completion is an
    error that says why, and the editor is warned, never a completion of the text the daemon kept.
    Undoing the edit sends the whole text again and completions come back, of the editor's text."""
    open_doc(client)
    assert (await inline(client, 4, 7)).items
    for version, text, why in ((2, "\ud800", "lone surrogate"), (4, "#" * (9 << 20), "larger than 8 MiB")):
        edit(client, version, (0, 0), (0, 0), text)
        with pytest.raises(JsonRpcException) as e:
            await inline(client, 4, 7)
        assert why in e.value.message
        assert any(why in m.message for m in client.messages)
        edit(client, version + 1, (0, 0), (0, len(text)), "")
        got = await inline(client, 4, 7)
        daemon_agrees(daemon, TEXT, 4, 7, got.items[0].insert_text[3:])
    with pytest.raises(JsonRpcException) as e:  # a 10 MB accept: answered, not left waiting
        await asyncio.wait_for(client.workspace_execute_command_async(t.ExecuteCommandParams(
            command="efim.accepted", arguments=[{"uri": URI, "id": "1", "text": "x" * (10 << 20)}])), 30)
    assert e.value.code == REQUEST_TOO_LARGE


@pytest.mark.asyncio
async def test_settings_languages_and_configuration_change(client):
    open_doc(client, uri="file:///work/proj/notes.md", language="markdown", text="# Notes\nabc")
    assert (await inline(client, 1, 3, uri="file:///work/proj/notes.md")).items
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"efim": {"enabledLanguages": ["python"], "maxTokens": 2}}))
    assert not (await inline(client, 1, 3, uri="file:///work/proj/notes.md")).items
    open_doc(client)
    await inline(client, 4, 7)
    assert client.efim_status[-1]["tokens"]["generated"] <= 2


@pytest.mark.asyncio
async def test_starts_the_daemon_when_none_runs(tmp_path, tiny_model):
    sock = tmp_path / "run" / "efim.sock"
    (tmp_path / "config.toml").write_text("max_prompt_ms = 0\n")
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               EFIM_CONFIG=str(tmp_path / "config.toml"), EFIM_MODEL=str(tiny_model), EFIM_SOCKET=str(sock))
    client = await start_client(env, init={"maxTokens": 4}, folders=(f"file://{tmp_path}",))
    uri = f"file://{tmp_path}/a.py"
    try:
        open_doc(client, uri=uri)
        edit(client, 2, (4, 7), (4, 7), "e", uri=uri)  # while the daemon starts: queued, applied once
        got = await inline(client, 4, 8, uri=uri)
        assert got.items and sock.exists()
        from efim_local.daemon.client import Client

        with Client(sock) as c:
            st = c.call("status")
        assert st["documents"] == 1 and str(tmp_path) in st["watching"]  # the folder became a watched root
        daemon_agrees(sock, TEXT + "e", 4, 8, got.items[0].insert_text[4:], path=str(tmp_path / "a.py"), max_tokens=4)
    finally:
        await client.shutdown_session()
        await client.stop()
        from efim_local.daemon.client import Client

        with Client(sock) as c:
            c.call("shutdown")


@pytest.mark.asyncio
async def test_daemon_restart_loses_no_request(tmp_path, tiny_model):
    """The daemon goes away under the server: the next completion reconnects (starting a daemon),
    opens the documents again (with their edits) and is answered, not lost."""
    d = Daemon(tmp_path / "d", tiny_model).start()
    env = dict(d.env, EFIM_MODEL=str(tiny_model))
    client = await start_client(env, "--socket", str(d.sock))
    try:
        open_doc(client)
        assert (await inline(client, 4, 7)).items
        d.stop()  # shut down: the relay sees its connection close
        edit(client, 2, (4, 7), (4, 7), "e")
        got = await inline(client, 4, 8)
        assert got.items and got.items[0].insert_text.startswith("gree")
        from efim_local.daemon.client import Client

        with Client(d.sock) as c:
            assert c.call("status")["documents"] == 1
        daemon_agrees(d, TEXT + "e", 4, 8, got.items[0].insert_text[4:])  # the edit applied once
    finally:
        await client.shutdown_session()
        await client.stop()
        from efim_local.daemon.client import Client

        with Client(d.sock) as c:
            c.call("shutdown")


def _frame(msg: dict) -> bytes:
    import json

    body = json.dumps(msg).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("shutdown,code", [(True, 0), (False, 1)])
def test_exit_code_and_the_documents_it_leaves_open(daemon, shutdown, code):
    """`exit` without `shutdown` first exits 1 (the LSP rule; it was 0); either way the documents it
    opened are closed in the daemon when it goes (a new user's trial found them left open for good)."""
    import subprocess

    def n_open():
        with daemon.client() as c:
            return c.call("status")["documents"]

    before = n_open()
    msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}},
            {"jsonrpc": "2.0", "method": "initialized", "params": {}},
            {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
                "uri": URI, "languageId": "python", "version": 1, "text": TEXT}}},
            {"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion", "params": {
                "textDocument": {"uri": URI}, "position": {"line": 4, "character": 7},
                "context": {"triggerKind": 2}}}]
    p = subprocess.Popen([sys.executable, "-m", "efim_local.cli", "lsp", "--socket", str(daemon.sock)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=daemon.env, cwd=str(ROOT))
    p.stdin.write(b"".join(map(_frame, msgs)))
    p.stdin.flush()
    deadline = time.monotonic() + 60
    while n_open() == before and time.monotonic() < deadline:  # its didOpen reached the daemon
        time.sleep(0.05)
    assert n_open() == before + 1
    tail = ([{"jsonrpc": "2.0", "id": 3, "method": "shutdown"}] if shutdown else []) + [
        {"jsonrpc": "2.0", "method": "exit"}]
    p.stdin.write(b"".join(map(_frame, tail)))
    p.stdin.close()
    assert p.wait(60) == code
    p.stdout.close()
    deadline = time.monotonic() + 30
    while n_open() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert n_open() == before


BIG = "".join(f"def f{i}(x):\n    return x * {i}\n\n\n" for i in range(400))  # ~8,000 tokens: bigger than a slot


def slots_of(daemon, path):
    """(background tasks queued, the token counts of the slots that hold ``path``), from the daemon."""
    from efim_local.daemon.client import Client

    with Client(daemon.sock, timeout=30) as c:
        st = c.call("status")
    return st["idle_tasks"], [s["tokens"] for s in st["slots"] if s["path"] == path]


def prefilled(daemon, path, timeout=120):
    """Wait until the daemon is idle with a slot of ``path`` holding the plan at line 1201 (opening the
    file prefilled 1,294 tokens of its top; the plan at that line is 1,800, a window of the file)."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        seen = slots_of(daemon, path)
        if seen[0] == 0 and any(n > 1500 for n in seen[1]):
            break
        time.sleep(0.2)
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["efim/cursor", "documentHighlight"])
async def test_where_the_cursor_settles_is_prefilled_before_the_first_keystroke(client, daemon, how):
    """The cursor settled on a line of a file bigger than a slot: the client says so (``efim/cursor``,
    as the VS Code extension does; or by asking ``documentHighlight``, as Neovim, Emacs and Zed do
    when the cursor rests), and the daemon prefills the plan anchored there, so that the first request
    there finds it cached. A malformed one (a bool, a line outside the document, a document not open)
    is dropped, the server serves on; a highlight is answered null (no highlights of its own)."""
    name = "big-cursor.py" if how == "efim/cursor" else "big-highlight.py"  # (one daemon: plans are remembered)
    uri, path = f"file:///work/proj/{name}", f"/work/proj/{name}"
    open_doc(client, text=BIG if how == "efim/cursor" else BIG.replace("x *", "x +"), uri=uri)  # (and its answers)
    assert client.server_capabilities.document_highlight_provider  # (not told the client sends efim/cursor)
    positions = ("nope", {"line": True, "character": 0}, {"line": -1, "character": 0}, {"line": 9999, "character": 0})
    bad = [{"uri": uri, "position": p} for p in positions] + [
        {"uri": "file:///nowhere.py", "position": {"line": 0, "character": 0}}, [1, 2]]
    if how == "efim/cursor":
        for b in bad:
            client.protocol.notify("efim/cursor", b)
        client.protocol.notify("efim/cursor", {"uri": uri, "position": {"line": 1201, "character": 4}})
    else:
        for b in bad:
            try:
                assert await raw_request(client, t.TEXT_DOCUMENT_DOCUMENT_HIGHLIGHT, b) is None
            except JsonRpcException as e:  # (a shape pygls refuses before the server sees it)
                assert e.code == INVALID_PARAMS
        got = await client.text_document_document_highlight_async(t.DocumentHighlightParams(
            text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(1201, 4)))
        assert got is None
    seen = await asyncio.to_thread(prefilled, daemon, path)
    got = await inline(client, 1201, 4, uri=uri)
    st = client.efim_status[-1]
    assert st["tokens"]["evaluated"] <= 2 and st["cache_tier"] == "slot" and got.items is not None, (st, seen)


@pytest.mark.asyncio
async def test_a_client_that_sends_efim_cursor_is_offered_no_highlights(daemon):
    """``cursorNotifications``: the client sends ``efim/cursor`` (the VS Code extension): the server
    offers no ``documentHighlight`` (an editor with none from its other servers keeps its own word
    highlighting)."""
    client = await start_client(daemon.env, "--socket", str(daemon.sock),
                                init={"maxTokens": 6, "cursorNotifications": True})
    try:
        assert not client.server_capabilities.document_highlight_provider
        assert client.server_capabilities.inline_completion_provider
    finally:
        await client.shutdown_session()
        await client.stop()


def test_neovims_own_lsp_client_tells_where_the_cursor_rests(daemon, tmp_path):
    """Neovim's built-in LSP client with ``efim lsp`` (no efim plugin), configured as most are
    (kickstart.nvim: ``document_highlight`` on ``CursorHold`` when the server offers it): the cursor
    rests on line 1202 of a file bigger than a slot, and the first request there finds its plan in a
    slot. The daemon hears of each line the cursor rests on once: resting again after typing on the
    line of its last note says nothing more; resting on a line typed on before any rest there does
    (an edit is no news of the cursor to it). A recording proxy between ``efim lsp`` and the daemon."""
    pynvim = pytest.importorskip("pynvim")
    if not neovims():
        pytest.skip("nvim is not installed (make test installs it)")
    from efim_local.daemon.client import Client

    src = tmp_path / "big.py"
    src.write_text(BIG.replace("x *", "x -"))  # (one daemon: not a plan another test computed)
    relay = Relay(tmp_path / "relay.sock", daemon.sock)
    listen = tmp_path / "nvim.sock"
    proc = subprocess.Popen([next(iter(neovims().values())), "--headless", "-u", "NONE", "-i", "NONE", "--listen",
                             str(listen)], env=daemon.env, cwd=str(ROOT), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        nv = wait_until(lambda: attach(pynvim, listen), 20, "nvim listening")
        nv.command(f"edit {src}")
        nv.exec_lua("""
            local id = vim.lsp.start_client({ name = "efim", cmd = { ... }, root_dir = vim.fn.getcwd() })
            vim.lsp.buf_attach_client(0, id)
            vim.api.nvim_create_autocmd("CursorHold", { callback = function()
                vim.lsp.buf.document_highlight() end })
        """, sys.executable, "-m", "efim_local.cli", "lsp", "--socket", relay.path)
        offered = """
            for _, c in pairs(vim.lsp.buf_get_clients(0)) do  -- (0.7: resolved_capabilities; later: server_capabilities)
                local caps = c.resolved_capabilities
                if caps then return caps.document_highlight == true end
                return c.server_capabilities ~= nil and c.server_capabilities.documentHighlightProvider == true
            end
            return false"""
        wait_until(lambda: nv.exec_lua(offered), 30, "efim lsp offering documentHighlight to Neovim")
        rest = lambda: nv.command("doautocmd CursorHold")  # (what resting fires after 'updatetime')
        notes = lambda: [m["params"]["position"]["line"] for m in relay.methods("cursor")]
        nv.current.window.cursor = (1202, 4)
        rest()
        wait_until(notes, 30, "a cursor note")
        seen = prefilled(daemon, str(src))
        with Client(daemon.sock, timeout=60) as c:
            res = c.call("complete", {"path": str(src), "position": {"line": 1201, "character": 4}, "max_tokens": 4})
        assert res["tokens"]["evaluated"] <= 2 and res["cache_tier"] == "slot", (seen, res["tokens"])
        assert [m["params"]["position"] for m in relay.methods("cursor")] == [{"line": 1201, "character": 4}]
        nv.input("iy<Esc>")  # typing on that line, then resting: nothing new
        wait_until(lambda: relay.methods("didChange"), 30, "the edit")
        rest()
        nv.current.window.cursor = (30, 0)  # another line, typed on before the cursor rested: a note
        nv.input("iz<Esc>")
        wait_until(lambda: len(relay.methods("didChange")) == 2, 30, "the second edit")
        rest()
        wait_until(lambda: len(notes()) == 2, 30, "the second cursor note")
        assert notes() == [1201, 29]
    finally:
        proc.kill()
        proc.wait(10)
        relay.close()


def attach(pynvim, listen):
    try:
        return pynvim.attach("socket", path=str(listen))
    except (FileNotFoundError, ConnectionRefusedError):
        return None
