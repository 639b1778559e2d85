"""Dispatch: a parsed message to its handler, and any failure to a JSON-RPC error reply.

Handlers return a result (sent as the reply), or ``DEFERRED`` when another
thread (the engine's) will reply. Every error goes through the error tree:
an ``EfimError`` keeps its code and message, anything else is a bug, logged
with its traceback and answered "internal error". A notification never gets
a reply, not even an error.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import EfimError, MethodNotFound, RequestTooLarge, internal
from .framing import MAX_FRAME, Connection, Message, Oversized, error, parse, reply

log = logging.getLogger("efim.daemon")
DEFERRED = object()  # the engine thread will reply

Handler = Callable[[Connection, Message], Any]


class Dispatcher:
    def __init__(self, methods: dict[str, Handler]):
        self.methods = methods

    def serve(self, conn: Connection) -> None:
        """Handle a connection's frames until it closes."""
        for line in conn.lines():
            self.handle(conn, line)

    def handle(self, conn: Connection, line: bytes | Oversized) -> None:
        if isinstance(line, Oversized):  # answered to its id when one can be read: a client waits on it
            conn.send(error(line.id(), RequestTooLarge(f"request larger than {MAX_FRAME >> 20} MiB")))
            return
        try:
            msg = parse(line)
        except EfimError as bad:
            conn.send(error(bad.request_id, bad))
            return
        try:
            handler = self.methods.get(msg.method)
            if handler is None:
                raise MethodNotFound(f"method not found: {msg.method}")
            result = handler(conn, msg)
            if result is not DEFERRED and not msg.is_notification:
                conn.send(reply(msg.id, result))
        except Exception as e:  # noqa: BLE001 - every failure becomes a reply
            if not isinstance(e, EfimError):
                log.exception("request %s failed", msg.method)
            if not msg.is_notification:
                conn.send(error(msg.id, internal(e)))
