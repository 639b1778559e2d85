"""The wire: JSON-RPC 2.0 messages, one UTF-8 JSON object per line (see docs/protocol.md).

Bytes to messages and back; nothing here knows what a method does.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import EfimError, InvalidParams, InvalidRequest, ParseError

MAX_FRAME = 8 << 20  # bytes per line
MAX_ID_LEN = 256


@dataclass
class Message:
    method: str
    params: dict
    id: Any = None  # None: a notification (no reply)
    is_notification: bool = True


def valid_id(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 53) or (
        isinstance(v, str) and len(v) <= MAX_ID_LEN)


def _bad(err: EfimError, rid: Any = None) -> EfimError:
    err.request_id = rid  # the id to answer to, when one could be read (never put on the wire)
    return err


def parse(line: bytes) -> Message:
    """Parse one frame; raises an EfimError whose ``request_id`` is the frame's id, if readable."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad(ParseError("parse error: not a UTF-8 JSON object")) from None
    if not isinstance(obj, dict):
        raise _bad(InvalidRequest("invalid request: expected a JSON object"))
    has_id = "id" in obj
    rid = obj.get("id")
    if has_id and not valid_id(rid):
        raise _bad(InvalidRequest("invalid request: id must be an integer or a short string"))
    if obj.get("jsonrpc") != "2.0":
        raise _bad(InvalidRequest('invalid request: "jsonrpc" must be "2.0"'), rid)
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        raise _bad(InvalidRequest('invalid request: "method" must be a non-empty string'), rid)
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise _bad(InvalidParams('invalid params: "params" must be an object'), rid)
    return Message(method, params, rid, not has_id)


def param(params: dict, key: str, kind, default=..., lo=None, hi=None):
    """Fetch and check one parameter; raises InvalidParams with a one-line reason."""
    if key not in params or params[key] is None:
        if default is ...:
            raise InvalidParams(f"invalid params: {key!r} is required")
        return default
    v = params[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise InvalidParams(f"invalid params: {key!r} must be {kind.__name__}")
    if lo is not None and v < lo or hi is not None and v > hi:
        raise InvalidParams(f"invalid params: {key!r} must be in [{lo}, {hi}]")
    return v


def reply(rid, result) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid, err: EfimError) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": rid, "error": err.to_json()})


def notification(method: str, params: dict) -> bytes:
    return _frame({"jsonrpc": "2.0", "method": method, "params": params})


def request(rid, method: str, params: dict | None = None) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})


def _frame(obj: dict) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (valid in JSON text, not in UTF-8): escape it
        return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def read_lines(sock: socket.socket) -> Iterator[bytes | None]:
    """Complete lines from a socket; an over-long line yields None once and is skipped."""
    buf = bytearray()
    skipping = False
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > MAX_FRAME:
                    if not skipping:
                        yield None
                    skipping = True
                    buf.clear()
                break
            line = bytes(buf[:nl])
            del buf[:nl + 1]
            if skipping:
                skipping = False
                continue
            if len(line) > MAX_FRAME:
                yield None
            elif line.strip():
                yield line


class Connection:
    """One client's socket: lines in, frames out (``send`` is safe from any thread)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.alive = True

    def send(self, data: bytes) -> None:
        with self.lock:
            if not self.alive:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                self.alive = False

    def lines(self) -> Iterator[bytes | None]:
        return read_lines(self.sock)

    def close(self) -> None:
        self.alive = False
        try:
            self.sock.close()
        except OSError:
            pass
