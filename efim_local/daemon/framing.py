"""The wire: JSON-RPC 2.0 messages, one UTF-8 JSON object per line (see docs/protocol.md).

Bytes to messages and back; nothing here knows what a method does.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import EfimError, InvalidParams, InvalidRequest, ParseError

log = logging.getLogger("efim.daemon")
MAX_FRAME = 8 << 20  # bytes per line
MAX_QUEUED = 32 << 20  # bytes of replies a connection may leave unread before it is dropped
SEND_TIMEOUT = 10.0  # seconds one frame may take to be written before the connection is dropped
MAX_ID_LEN = 256
HEAD = 1024  # bytes of an over-long frame kept to read its id


@dataclass
class Oversized:
    """A frame over ``MAX_FRAME`` (skipped): its first ``HEAD`` bytes, to address the error reply."""

    head: bytes

    def id(self):
        return leading_id(self.head)


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


_WS = re.compile(r"[ \t\r\n]*")


def leading_id(head: bytes):
    """The ``id`` of a frame from its first bytes (None if unreadable): the object's members are
    read in order while their values are scalars (efim's clients write ``jsonrpc``, ``id`` and
    ``method`` before ``params``); a nested value or a cut ends the search."""
    s, dec = head.decode("utf-8", "ignore"), json.JSONDecoder()
    try:
        i = _WS.match(s, 0).end()
        if s[i] != "{":
            return None
        i += 1
        for _ in range(16):
            i = _WS.match(s, i).end()
            if s[i] != '"':
                return None
            key, i = json.decoder.scanstring(s, i + 1)
            i = _WS.match(s, i).end()
            if s[i] != ":":
                return None
            i = _WS.match(s, i + 1).end()
            if s[i] in "{[":
                return None
            value, i = dec.raw_decode(s, i)
            i = _WS.match(s, i).end()
            if s[i] not in ",}":  # IndexError at the cut: a number there may be cut short
                return None
            if key == "id":
                return value if valid_id(value) else None
            i += 1
    except (ValueError, IndexError):
        return None
    return None


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
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or an infinity: no JSON number (JSON.parse refuses the bare words)
        log.warning("a message held a number that is not finite: sent as null")
        obj = finite(obj)
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (valid in JSON text, not in UTF-8): escape it
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def finite(obj):
    """``obj`` with every NaN and infinity replaced by None (dicts, lists and tuples are copied)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def read_lines(sock: socket.socket, idle_timeout: float | None = None,
               frame_timeout: float | None = None) -> Iterator[bytes | Oversized]:
    """Complete lines from a socket; an over-long line yields ``Oversized`` once and is skipped.

    ``idle_timeout``: seconds a connection may stay silent between frames; ``frame_timeout``:
    seconds one frame may take from its first byte to its newline, however its bytes trickle in
    (a timeout per ``recv`` would let a client that sends a byte a second hold on forever).
    Either ends the connection."""
    buf = bytearray()
    skipping = False  # inside an over-long line
    frame_deadline = None  # set while a frame is partly read
    while True:
        waits = [t for t in (idle_timeout, None if frame_deadline is None else frame_deadline - time.monotonic())
                 if t is not None]
        if waits and min(waits) <= 0:
            log.info("dropped a connection: a frame took more than %s s", frame_timeout)
            return
        try:
            # Never None: blocking mode would be shared with the writer's dup() of this socket.
            sock.settimeout(min(waits) if waits else 3600.0)
            chunk = sock.recv(1 << 16)
        except socket.timeout:
            if frame_deadline is None and idle_timeout is not None:
                return  # silent for idle_timeout
            continue  # the frame deadline is checked at the top
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        completed = False  # a frame ended: the next one's clock starts now (after its handling)
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > MAX_FRAME:
                    if not skipping:
                        yield Oversized(bytes(buf[:HEAD]))
                    skipping = True
                    buf.clear()
                break
            line = bytes(buf[:nl])
            del buf[:nl + 1]
            completed = True
            if skipping:
                skipping = False
                continue
            if len(line) > MAX_FRAME:
                yield Oversized(line[:HEAD])
            elif line.strip():
                yield line
        partial = bool(buf) or skipping
        if not partial:
            frame_deadline = None
        elif (frame_deadline is None or completed) and frame_timeout is not None:
            frame_deadline = time.monotonic() + frame_timeout


class Connection:
    """One client's socket: lines in (the caller's thread), frames out (a writer thread of its own).

    ``send`` never blocks: it queues the frame for the writer. A client that does not read its
    replies costs only its own connection: past ``max_queued`` bytes waiting, or when one frame
    cannot be written within ``send_timeout`` seconds, the connection is dropped. So the engine
    thread, which replies to everyone, never waits on a socket."""

    def __init__(self, sock: socket.socket, max_queued: int = MAX_QUEUED, send_timeout: float = SEND_TIMEOUT,
                 idle_timeout: float | None = None, frame_timeout: float | None = None):
        self.sock = sock
        self.wsock = sock.dup()  # the writer's own timeout (a socket object has one for both directions)
        self.wsock.settimeout(send_timeout)
        self.max_queued, self.send_timeout = max_queued, send_timeout
        self.idle_timeout, self.frame_timeout = idle_timeout, frame_timeout
        self.cond = threading.Condition()
        self.out: deque[bytes] = deque()
        self.queued = 0
        self.alive = True  # False: dropped, nothing more is sent
        self.closing = False  # the reader is done: the writer flushes what is queued, then closes
        self.writer = threading.Thread(target=self._write, name="efim-conn-writer", daemon=True)
        try:
            self.writer.start()
        except RuntimeError:  # no more threads: this connection is refused, the caller closes sock
            self.wsock.close()
            raise

    def send(self, data: bytes) -> None:
        with self.cond:
            if not self.alive or self.closing:
                return
            if self.queued + len(data) > self.max_queued:
                log.warning("dropped a connection: %d bytes of replies unread", self.queued)
                self._drop()
                return
            self.out.append(data)
            self.queued += len(data)
            self.cond.notify()

    def lines(self) -> Iterator[bytes | Oversized]:
        return read_lines(self.sock, self.idle_timeout, self.frame_timeout)

    def close(self) -> None:
        """The reader is done: send what is queued (within the send deadline), then close."""
        with self.cond:
            self.closing = True
            self.cond.notify()

    def _drop(self) -> None:  # holding self.cond
        self.alive = False
        self.out.clear()
        self.queued = 0
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader's recv
        except OSError:
            pass
        self.cond.notify()

    def _write(self) -> None:
        while True:
            with self.cond:
                while self.alive and not self.out and not self.closing:
                    self.cond.wait()
                if not self.alive or not self.out:
                    break
                data = self.out.popleft()
                self.queued -= len(data)
            try:
                self.wsock.sendall(data)
            except OSError as e:  # a timeout too: the client stopped reading
                with self.cond:
                    if isinstance(e, socket.timeout):
                        log.warning("dropped a connection: a reply could not be sent within %s s", self.send_timeout)
                    self._drop()
                break
        for s in (self.wsock, self.sock):
            try:
                s.close()
            except OSError:
                pass
