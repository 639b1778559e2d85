"""Attacks on ``efim lsp`` (issue 27): refused edits, bad LSP frames, a daemon that cannot start.

Each runs a real ``efim lsp`` in a subprocess, relaying to the target daemon, and speaks to it
frame by frame (``Lsp``), malformed frames included.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from efim_local import errors as E
from .base import Failed, Raw, Target, check, error_code, small_complete

MB = 1 << 20


def frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()  # ASCII: a lone surrogate travels as its escape
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Lsp:
    """``efim lsp --socket SOCK`` in a subprocess; frames in as given, messages out as they came."""

    def __init__(self, sock: Path, env: dict | None = None, root: Path | None = None):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "efim_local.cli", "lsp", "--socket", str(sock)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     env={**os.environ, **(env or {})})
        self.inbox: queue.Queue = queue.Queue()
        self.messages: list[str] = []  # window/showMessage texts
        threading.Thread(target=self._read, daemon=True).start()
        self.ids = iter(range(1, 1 << 30))
        self.request("initialize", {"processId": None, "rootUri": root and root.as_uri(), "capabilities": {},
                                    "initializationOptions": {"maxTokens": 2}})
        self.notify("initialized", {})

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:
                self.inbox.put(None)
                return
            msg = json.loads(out.read(length))
            if msg.get("method") == "window/showMessage":
                self.messages.append(msg["params"]["message"])
            self.inbox.put(msg)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self.send(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    def request(self, method: str, params: dict, rid=None, timeout: float = 60.0) -> dict:
        rid = next(self.ids) if rid is None else rid
        self.send(frame({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        return self.reply(rid, timeout)

    def reply(self, rid, timeout: float = 60.0) -> dict:
        """The answer to request ``rid`` (server requests and notifications on the way are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise Failed(f"request {rid!r} was not answered within {timeout:.0f} s") from None
            if msg is None:
                raise Failed(f"efim lsp exited (code {self.proc.wait(10)}): {self.stderr()[-300:]}")
            if msg.get("id") == rid and "method" not in msg:
                return msg

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": version,
                                                              "text": text}})

    def change(self, uri: str, version: int, changes: list) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": changes})

    def inline(self, uri: str, line: int, character: int) -> dict:
        return self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 2}})

    def close(self) -> None:
        try:
            self.request("shutdown", None, timeout=10)
            self.notify("exit", None)
            self.proc.wait(10)
        except (Failed, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        self.err.close()


def _insert(line: int, character: int, text: str) -> dict:
    return {"range": {"start": {"line": line, "character": character}, "end": {"line": line, "character": character}},
            "text": text}


def _delete(line: int, start: int, end: int) -> dict:
    return {"range": {"start": {"line": line, "character": start}, "end": {"line": line, "character": end}},
            "text": ""}


def lsp_refused_edit(t: Target) -> str:
    """An edit the daemon refuses (a lone surrogate; 9 MB): the completion is an error naming the
    reason (never a completion of the older text) and the editor is warned; undoing the edit brings
    completions back."""
    uri = (t.tmp / "refused.py").as_uri()
    lsp = Lsp(t.sock)
    try:
        lsp.open(uri, "def f(x):\n    return x\n\ny = f")
        check("result" in lsp.inline(uri, 3, 5), "a completion before the attack failed")
        for version, text, word in ((2, "\ud800", "surrogate"), (4, "#" * (9 * MB), "larger than 8 MiB")):
            lsp.change(uri, version, [_insert(0, 0, text)])
            r = lsp.inline(uri, 3, 5)
            check("error" in r, f"a completion of the older text after a refused edit ({word}): {r}")
            check(word in r["error"]["message"], f"the error does not say why: {r['error']['message']}")
            lsp.change(uri, version + 1, [_delete(0, 0, len(text))])  # ASCII or one surrogate: 1 unit each
            r = lsp.inline(uri, 3, 5)
            check("result" in r, f"no completion once the edit was undone: {r}")
        check(len(lsp.messages) >= 2, f"the editor was not warned: {lsp.messages}")
    finally:
        lsp.close()
    return "surrogate and 9 MB edits: completions refused with the reason, back after undo"


def lsp_big_accept(t: Target) -> str:
    """``efim.accepted`` with a 10 MB text: answered (an error), not left waiting."""
    lsp = Lsp(t.sock)
    try:
        t0 = time.monotonic()
        r = lsp.request("workspace/executeCommand", {"command": "efim.accepted", "arguments": [
            {"uri": (t.tmp / "a.py").as_uri(), "id": "1", "text": "x" * (10 * MB)}]}, timeout=30)
        check(error_code(r) == E.REQUEST_TOO_LARGE, f"10 MB accepted: {r}")
    finally:
        lsp.close()
    return f"answered {r['error']['message']!r} in {(time.monotonic() - t0) * 1e3:.0f} ms"


def lsp_content_length(t: Target) -> str:
    """``Content-Length`` of 10^23 and of 5e10: refused, efim lsp lives and reads the next message."""
    lsp = Lsp(t.sock)
    try:
        for n in (b"99999999999999999999999", b"50000000000"):
            lsp.send(b"Content-Length: " + n + b"\r\n\r\n")
            r = lsp.request("workspace/executeCommand",
                            {"command": "efim.accepted", "arguments": [{"uri": "file:///a.py", "text": "ab"}]})
            check("result" in r, f"the message after Content-Length {n.decode()}: {r}")
    finally:
        lsp.close()
    return "10^23 and 5e10 refused; the next messages answered"


def lsp_framing(t: Target) -> str:
    """A frame without Content-Length, one with a short Content-Length, and LF-only headers: the
    messages after each are read (the LF-only one too); a refused request is answered."""
    lsp = Lsp(t.sock)
    ok = {"command": "efim.accepted", "arguments": [{"uri": "file:///a.py", "text": "ab"}]}
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": "nolen", "method": "workspace/executeCommand", "params": ok})
        lsp.send(b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + body.encode())
        check("error" in lsp.reply("nolen"), "a frame without Content-Length was not refused")
        check("result" in lsp.request("workspace/executeCommand", ok, "after-nolen"), "after no Content-Length")
        body = json.dumps({"jsonrpc": "2.0", "id": "short", "method": "workspace/executeCommand", "params": ok})
        lsp.send(b"Content-Length: %d\r\n\r\n" % (len(body) - 10) + body.encode())
        check("error" in lsp.reply("short"), "a short Content-Length was not answered")
        check("result" in lsp.request("workspace/executeCommand", ok, "after-short"), "after a short Content-Length")
        body = json.dumps({"jsonrpc": "2.0", "id": "lf", "method": "workspace/executeCommand", "params": ok})
        lsp.send(b"Content-Length: %d\n\n" % len(body) + body.encode())
        check("result" in lsp.reply("lf"), "LF-only headers")
        check("result" in lsp.request("workspace/executeCommand", ok, "after-lf"), "after LF-only headers")
        check(lsp.proc.poll() is None, "efim lsp exited")
    finally:
        lsp.close()
    small_complete(t)
    return "no Content-Length, a short one, LF-only: each answered, the next messages read"


def oversized_frame(t: Target) -> str:
    """A 9 MB frame with an id (``efim lsp``'s didChange of a huge edit): refused to its id."""
    big = {"jsonrpc": "2.0", "id": "huge", "method": "didChange",
           "params": {"path": str(t.tmp / "h.py"), "contentChanges": [{"text": "x" * (9 * MB)}]}}
    with Raw(t.sock, 60) as c:
        c.send(big)
        r = c.read()
    check(r.get("id") == "huge" and error_code(r) == E.REQUEST_TOO_LARGE, f"reply: {str(r)[:200]}")
    return "answered REQUEST_TOO_LARGE to its id"


def lsp_no_daemon(t: Target) -> str:
    """``efim lsp`` when the daemon cannot start (a missing model): started once, not on every
    request; each request's error and the editor's warning say why."""
    home = Path(tempfile.mkdtemp(prefix="efim-nodaemon-", dir=t.tmp))
    env = {"XDG_STATE_HOME": str(home / "state"), "XDG_RUNTIME_DIR": str(home / "run"),
           "EFIM_MODEL": str(home / "missing.gguf"), "EFIM_CONFIG": str(home / "none.toml")}
    (home / "none.toml").write_text("")
    lsp = Lsp(home / "run" / "efim.sock", env=env)
    uri = (home / "a.py").as_uri()
    try:
        lsp.open(uri, "x = 1\n")
        errors = [lsp.inline(uri, 0, 3).get("error", {}).get("message", "") for _ in range(5)]
    finally:
        lsp.close()
    log = (home / "state" / "efim" / "daemon.log").read_text()
    starts = log.count("model file not found")
    check(all("model file not found" in e for e in errors), f"an error does not say why: {errors}")
    check(starts <= 2, f"{starts} daemon starts for 6 requests")
    check(any("model file not found" in m for m in lsp.messages), f"the editor was not told: {lsp.messages}")
    return f"{starts} start for 6 requests; reason given: ...{errors[-1][-60:]}"


ATTACKS: dict[str, Callable[[Target], str]] = {f.__name__: f for f in (
    lsp_refused_edit, lsp_big_accept, lsp_content_length, lsp_framing, oversized_frame, lsp_no_daemon)}
OWN_DAEMON = ("lsp_no_daemon",)
