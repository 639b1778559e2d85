"""The LSP server's connection to the shared daemon (asyncio; many requests in flight).

``notify`` and ``request`` write at once, without awaiting, so messages reach the daemon in the order
the editor sent them; until the connection is up they wait in an outbox, in order. A new connection
(the first, or after the daemon went away: pending requests then fail with ``DaemonUnavailable``)
starts the daemon when ``start`` is set, runs ``on_connect`` first (it opens the documents as they
are now), and then sends the outbox without its document-sync messages (``sync=True``): the
documents already hold those edits, and an edit sent twice would apply twice.

When the daemon cannot be started, it is started once, its reason is kept (and given to
``on_start_failed``), and requests fail at once with that reason until a back-off delay (1 s,
doubling up to a minute) has passed; then the next request tries again. A frame the daemon would
refuse as too large is refused here, without sending it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..daemon.framing import MAX_FRAME, request
from ..errors import AlreadyRunning, DaemonUnavailable, EfimError, RequestTooLarge, from_wire

log = logging.getLogger("efim.lsp")
READ_LIMIT = 16 << 20  # bytes per reply line
BACKOFF = (1.0, 60.0)  # seconds before starting the daemon again after a failed start: first, most


class Relay:
    """Requests to the daemon on ``sock_path`` (default: ``$EFIM_SOCKET`` or the runtime dir)."""

    def __init__(self, sock_path: str | Path | None = None, start: bool = True,
                 on_connect: Callable[[], None] | None = None,
                 on_notification: Callable[[dict], None] | None = None,
                 on_start_failed: Callable[[str], None] | None = None):
        self.sock_path, self.start = sock_path, start
        self.on_connect, self.on_notification = on_connect, on_notification
        self.on_start_failed = on_start_failed
        self.start_error: str | None = None  # why the last start failed
        self.retry_at = 0.0  # monotonic time before which no start is tried again
        self.backoff = BACKOFF[0]
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.outbox: list[tuple[bytes, int | None]] = []  # (frame, its id if a sync request, -1 if a sync notification)
        self.writer: asyncio.StreamWriter | None = None
        self.connecting: asyncio.Task | None = None
        self.error: str | None = None  # why the last connection attempt failed

    # -- sending ----------------------------------------------------------------------------
    def request(self, method: str, params: dict, sync: bool = False) -> tuple[int, asyncio.Future]:
        """Send a request now; returns its id and the future of its result. ``sync``: a document-sync
        message, answered None without being sent when a new connection replays the documents."""
        rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        frame = request(rid, method, params)
        if len(frame) > MAX_FRAME:  # the daemon would refuse it: not worth sending
            fut.set_exception(RequestTooLarge(f"request larger than {MAX_FRAME >> 20} MiB ({method})"))
            return rid, fut
        self.pending[rid] = fut
        self._write(frame, rid if sync else None)
        return rid, fut

    async def call(self, method: str, params: dict) -> Any:
        return await self.request(method, params)[1]

    def notify(self, method: str, params: dict, sync: bool = False) -> None:
        self._write(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n",
                    -1 if sync else None)

    def _write(self, frame: bytes, sync_id: int | None = None) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(frame)
            return
        self.outbox.append((frame, sync_id))
        if self.connecting is None or self.connecting.done():
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    # -- connecting -------------------------------------------------------------------------
    def path(self) -> str:
        from ..daemon import paths

        return str(self.sock_path or paths.socket_path())

    async def _connect(self) -> None:
        try:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path(), limit=READ_LIMIT)
            except OSError:
                if not self.start:
                    raise
                await self._start_once()
                reader, writer = await asyncio.open_unix_connection(self.path(), limit=READ_LIMIT)
        except (OSError, EfimError) as e:
            self.error = f"no efim daemon at {self.path()}: {e}"
            log.warning("%s", self.error)
            self._fail_all(DaemonUnavailable(self.error))
            return
        self.error = None
        self.writer = writer
        outbox, self.outbox = self.outbox, []
        if self.on_connect:
            self.on_connect()  # writes the documents as they are now, before the waiting messages
        for frame, sync_id in outbox:
            if sync_id is None or not self.on_connect:
                writer.write(frame)
            elif (fut := self.pending.pop(sync_id, None)) is not None and not fut.done():
                fut.set_result(None)  # covered by the replay
        asyncio.get_running_loop().create_task(self._read(reader, writer))

    async def _start_once(self) -> None:
        """Start the daemon, unless the last start failed less than the back-off delay ago (then
        fail at once with its reason)."""
        wait = self.retry_at - time.monotonic()
        if self.start_error is not None and wait > 0:
            raise DaemonUnavailable(f"it could not be started: {self.start_error} (next try in {wait:.0f} s)")
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._start_daemon)
        except EfimError as e:
            self.start_error = str(e)
            self.retry_at = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF[1])
            if self.on_start_failed:
                self.on_start_failed(self.start_error)
            raise DaemonUnavailable(f"it could not be started: {e}") from None
        self.start_error, self.backoff = None, BACKOFF[0]

    def _start_daemon(self) -> None:
        from .. import config as config_mod
        from ..daemon.launch import start_daemon

        if self.sock_path:  # the daemon and its `running()` probes use $EFIM_SOCKET
            os.environ["EFIM_SOCKET"] = str(self.sock_path)
        log.info("starting the efim daemon on %s", self.path())
        try:
            start_daemon(120.0, config_mod.load())
        except AlreadyRunning:  # another editor started it meanwhile
            pass

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                self._dispatch(json.loads(line))
        except (OSError, ValueError, asyncio.LimitOverrunError) as e:
            log.warning("daemon connection failed: %s", e)
        finally:
            if self.writer is writer:
                self.writer = None
            writer.close()
            self._fail_all(DaemonUnavailable("the efim daemon closed the connection"))

    def _dispatch(self, msg: dict) -> None:
        if msg.get("id") is None and "error" in msg:  # a frame it could not read: a bug of ours
            log.warning("the daemon refused a message: %s", (msg["error"] or {}).get("message"))
            return
        if "id" not in msg:
            if self.on_notification:
                self.on_notification(msg)
            return
        fut = self.pending.pop(msg["id"], None)
        if fut is None or fut.done():
            return
        if "error" in msg:
            fut.set_exception(from_wire(msg["error"]))
        else:
            fut.set_result(msg.get("result"))

    def _fail_all(self, err: EfimError) -> None:
        pending, self.pending = self.pending, {}
        self.outbox.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
