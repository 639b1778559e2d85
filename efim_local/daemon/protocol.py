"""JSON-RPC 2.0 over a stream, one JSON object per line (UTF-8). See docs/protocol.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BUSY = -32001  # the request queue is full: retry later
MODEL_ERROR = -32002  # llama.cpp failed on this request
REQUEST_TOO_LARGE = -32003
CANCELLED = -32800  # cancelled or superseded (LSP's RequestCancelled)

MAX_FRAME = 8 << 20  # bytes per line
MAX_ID_LEN = 256


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def to_json(self) -> dict:
        err = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


@dataclass
class Message:
    method: str
    params: dict
    id: Any = None  # None: a notification (no reply)
    is_notification: bool = True


def valid_id(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 53) or (
        isinstance(v, str) and len(v) <= MAX_ID_LEN)


def parse(line: bytes) -> Message:
    """Parse one frame; raises RpcError (with the id when one could be read)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RpcError(PARSE_ERROR, "parse error: not a UTF-8 JSON object") from None
    if not isinstance(obj, dict):
        raise RpcError(INVALID_REQUEST, "invalid request: expected a JSON object")
    has_id = "id" in obj
    rid = obj.get("id")
    if has_id and not valid_id(rid):
        raise RpcError(INVALID_REQUEST, "invalid request: id must be an integer or a short string")
    err = lambda msg: RpcError(INVALID_REQUEST, f"invalid request: {msg}", None)
    if obj.get("jsonrpc") != "2.0":
        e = err('"jsonrpc" must be "2.0"')
        e.data = {"id": rid} if has_id else None
        raise e
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        e = err('"method" must be a non-empty string')
        e.data = {"id": rid} if has_id else None
        raise e
    params = obj.get("params", {})
    if not isinstance(params, dict):
        e = RpcError(INVALID_PARAMS, 'invalid params: "params" must be an object')
        e.data = {"id": rid} if has_id else None
        raise e
    return Message(method, params, rid, not has_id)


def reply(rid, result) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid, err: RpcError) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": rid, "error": err.to_json()})


def notification(method: str, params: dict) -> bytes:
    return _frame({"jsonrpc": "2.0", "method": method, "params": params})


def _frame(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


# -- params --------------------------------------------------------------------------

def get(params: dict, key: str, kind, default=..., lo=None, hi=None):
    """Fetch and check one parameter; raises INVALID_PARAMS with a one-line reason."""
    if key not in params or params[key] is None:
        if default is ...:
            raise RpcError(INVALID_PARAMS, f"invalid params: {key!r} is required")
        return default
    v = params[key]
    ok = isinstance(v, kind) and not (kind in (int, (int, float)) and isinstance(v, bool))
    if not ok:
        name = kind.__name__ if isinstance(kind, type) else "number"
        raise RpcError(INVALID_PARAMS, f"invalid params: {key!r} must be {name}")
    if lo is not None and v < lo or hi is not None and v > hi:
        raise RpcError(INVALID_PARAMS, f"invalid params: {key!r} must be in [{lo}, {hi}]")
    return v
