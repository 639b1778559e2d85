"""Reading LSP messages from stdin so that a bad frame costs only itself.

pygls' reader trusts its input: a ``Content-Length`` of 10^23 makes it exit, and a frame without
the header, with a short length or with LF-only line ends leaves it out of step, losing the
messages after it. This reader:

- takes LF-only header lines and any case of the header's name;
- refuses a frame whose ``Content-Length`` is missing, not a number or over ``MAX_BODY``, and a
  body that is not JSON (a wrong length); the bytes after it are skipped up to the next
  ``Content-Length:``, so the next message is read as usual (a body that swallowed the next
  frame gives it back);
- answers a refused request with an error when its ``id`` can be read from its first bytes, and
  puts the documents a refused edit may have touched out of step (see ``sync.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass
from typing import BinaryIO

from pygls.exceptions import JsonRpcException, JsonRpcParseError
from pygls.io_ import StdoutWriter

from ..daemon.framing import leading_id

log = logging.getLogger("efim.lsp")
MAX_BODY = 64 << 20  # bytes of one message (the daemon takes 8 MiB documents, as JSON up to ~6x that)
MAX_HEADER = 8 << 10  # bytes of one header line
MAX_HEADERS = 32  # lines of one header block
KEEP = 64 << 10  # bytes of a refused frame kept to read its id and method
HEADER = re.compile(rb"([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*?)[ \t]*\r?")
NEXT = re.compile(rb"(?i)content-length[ \t]*:")


@dataclass
class Bad:
    """A refused frame: why, and its first bytes (to answer it)."""

    reason: str
    data: bytes


class Frames:
    """Message bodies from a blocking binary stream (``next`` runs in a worker thread)."""

    def __init__(self, stream: BinaryIO, chunk: int = 1 << 16):
        self.stream, self.chunk = stream, chunk
        self.buf = bytearray()
        self.resync = False  # skip to the next Content-Length before reading headers

    def _fill(self) -> bool:
        read = getattr(self.stream, "read1", self.stream.read)
        data = read(self.chunk)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes | None:
        """One header line without its line end; None at the end; b"\\0" (junk) if too long."""
        while True:
            nl = self.buf.find(b"\n", 0, MAX_HEADER + 1)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[:nl + 1]
                return line
            if len(self.buf) > MAX_HEADER:
                return b"\0"
            if not self._fill():
                return None

    def _skip(self) -> None:
        """Drop bytes up to the next ``Content-Length:`` (kept), or to the end."""
        while True:
            m = NEXT.search(self.buf)
            if m:
                del self.buf[:m.start()]
                return
            del self.buf[:max(0, len(self.buf) - 32)]  # a header cut between two reads
            if not self._fill():
                self.buf.clear()
                return

    def next(self) -> bytes | Bad | None:
        """The next message body, a ``Bad`` frame, or None at the end of the input."""
        if self.resync:
            self.resync = False
            self._skip()
        length, n = None, 0
        while True:
            line = self._line()
            if line is None:
                return None
            if not line.strip():
                if n == 0:
                    continue  # blank lines between frames
                break
            n += 1
            m = HEADER.fullmatch(line)
            if m is None or n > MAX_HEADERS:
                return self._bad("not an LSP header", line)
            if m[1].lower() == b"content-length":
                length = m[2]
        if length is None or not length.isdigit() or len(length) > 12 or int(length) > MAX_BODY:
            why = "no Content-Length header" if length is None else \
                f"Content-Length {length[:40].decode('ascii', 'replace')} refused (at most {MAX_BODY >> 20} MiB)"
            return self._bad(why, b"")
        size = int(length)
        while len(self.buf) < size:
            if not self._fill():
                return None
        body = bytes(self.buf[:size])
        del self.buf[:size]
        return body

    def _bad(self, reason: str, junk: bytes) -> Bad:
        m = NEXT.search(junk, 1)
        if m:  # a body without its line end ran into the next frame's header: give that back
            self.buf[:0] = junk[m.start():] + b"\n"
            junk = junk[:m.start()]
        else:
            self.resync = True
        return Bad(reason, junk + bytes(self.buf[:KEEP]) if not m else junk)

    def give_back(self, body: bytes) -> None:
        """``body`` was not JSON: a header inside it (a Content-Length too long) starts the next frame."""
        m = NEXT.search(body, 1)
        if m:
            self.buf[:0] = body[m.start():]
        else:
            self.resync = True  # a length too short: the rest of the body comes next


async def run(stop: threading.Event, frames: Frames, server) -> None:
    """pygls' message loop over ``frames``; ``server`` is the EfimServer (its protocol and sync)."""
    loop = asyncio.get_running_loop()
    protocol = server.protocol
    while not stop.is_set():
        body = await loop.run_in_executor(server.thread_pool, frames.next)
        if body is None:
            break
        if isinstance(body, Bad):
            refused(server, body.reason, body.data)
            continue
        try:
            message = json.loads(body, object_hook=lambda d: _structure(protocol, d))
        except (ValueError, RecursionError):  # not JSON (the hook's own errors are not ValueErrors)
            frames.give_back(body)
            refused(server, "not a JSON message (a wrong Content-Length?)", body[:KEEP])
            continue
        except _Unstructured as e:
            if not isinstance(e.error, JsonRpcException):  # those are answered by structure_message
                log.warning("efim: a message does not fit its type: %s", e.error)
            continue
        try:
            protocol.handle_message(message)
        except Exception:  # noqa: BLE001 - one message never ends the server
            log.exception("efim: a message failed")


class _Unstructured(Exception):
    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _structure(protocol, obj: dict):
    try:
        return protocol.structure_message(obj)
    except Exception as e:  # noqa: BLE001 - told apart from a JSON error
        raise _Unstructured(e) from None


def refused(server, reason: str, data: bytes) -> None:
    """Answer a refused frame when its id can be read; an edit it may have held puts documents out of step."""
    log.warning("efim: refused a message from the editor: %s", reason)
    rid = leading_id(data)
    if rid is not None:
        server.protocol._send_response(rid, error=JsonRpcParseError(f"efim: {reason}").to_response_error())
    if b"textDocument/did" in data:
        server.sync.lost(data, reason)


def start_io(server, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """Serve on stdin/stdout with this reader (pygls' ``start_io`` otherwise)."""
    server._stop_event = stop = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    code = 0
    try:
        asyncio.run(run(stop, Frames(stdin or sys.stdin.buffer), server))
    except BrokenPipeError:
        log.error("efim: the editor closed the connection")
    except KeyboardInterrupt:
        pass
    except SystemExit as e:  # pygls' exit: 1 when no shutdown came first (the LSP rule)
        code = e.code if isinstance(e.code, int) else 0
    finally:
        server.shutdown()
    if code:
        sys.exit(code)
