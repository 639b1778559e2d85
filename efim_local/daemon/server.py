"""The Unix-socket server: owner-only access, one thread per connection.

Layers: ``framing`` (bytes ↔ JSON-RPC messages) → ``dispatch`` (message →
handler, failure → error reply) → ``handlers`` (the methods) → ``worker``
(the engine thread).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
import threading
import time
from pathlib import Path

from ..engine import Engine
from ..errors import AlreadyRunning, Busy
from . import paths
from .dispatch import Dispatcher
from .framing import Connection, error
from .handlers import Handlers
from .worker import Worker

log = logging.getLogger("efim.daemon")
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 3600.0  # seconds a connection may stay silent before it is closed
_UCRED = struct.Struct("3i")


def peer_uid(sock: socket.socket) -> int:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


class Server:
    def __init__(self, sock_path: Path | None = None, queue_size: int = 16, watch: bool = True):
        self.sock_path = Path(sock_path or paths.socket_path())
        self.queue_size = queue_size
        self.engine: Engine | None = None
        self.worker: Worker | None = None
        self.handlers: Handlers | None = None
        self.dispatcher: Dispatcher | None = None
        self.lock_fd: int | None = None
        self.sock: socket.socket | None = None
        self.conns: set[Connection] = set()
        self.conns_lock = threading.Lock()
        self.started = time.time()
        self.stopping = threading.Event()
        self.watcher = None
        if watch:
            from .watcher import Watcher

            self.watcher = Watcher(lambda path: self.handlers.file_changed(path))

    # -- socket lifecycle ---------------------------------------------------------------
    def bind(self) -> None:
        """Take the lock, replace a stale socket, refuse if another daemon answers."""
        d = self.sock_path.parent
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
        self.lock_fd = os.open(str(self.sock_path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AlreadyRunning(f"another efim daemon is running on {self.sock_path}") from None
        if self.sock_path.exists() or self.sock_path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.sock_path))
                raise AlreadyRunning(f"another efim daemon is running on {self.sock_path}")
            except (ConnectionRefusedError, FileNotFoundError, OSError) as e:
                if isinstance(e, AlreadyRunning):
                    raise
                log.info("replacing stale socket %s", self.sock_path)
                self.sock_path.unlink(missing_ok=True)
            finally:
                probe.close()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600
        try:
            self.sock.bind(str(self.sock_path))
        finally:
            os.umask(old)
        os.chmod(self.sock_path, 0o600)
        self.sock.listen(16)

    def attach(self, engine: Engine) -> None:
        """Give the server its engine (loaded after bind(), so a second daemon is refused fast)."""
        self.engine = engine
        self.worker = Worker(engine, self.queue_size)
        self.handlers = Handlers(self, engine, self.worker)
        self.dispatcher = Dispatcher(self.handlers.table())
        self.worker.add_idle(lambda e, should_stop: e.calibrate(should_stop), key="calibrate")  # latency budget

    def serve_forever(self) -> None:
        self.worker.start()
        if self.watcher:
            self.watcher.start()
        self.sock.settimeout(0.5)
        try:
            while not self.stopping.is_set():
                try:
                    client, _ = self.sock.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if e.errno in (errno.EBADF, errno.EINVAL):
                        break
                    raise
                self.accept(client)
        finally:
            self.close()

    def accept(self, client: socket.socket) -> None:
        client.settimeout(IDLE_TIMEOUT)
        uid = peer_uid(client)
        if uid != os.getuid():
            log.warning("refused a connection from uid %d", uid)
            client.close()
            return
        conn = Connection(client)
        with self.conns_lock:
            full = len(self.conns) >= MAX_CONNECTIONS
            if not full:
                self.conns.add(conn)
        if full:
            conn.send(error(None, Busy("busy: too many connections")))
            conn.close()
            return
        threading.Thread(target=self._serve_connection, args=(conn,), name="efim-conn", daemon=True).start()

    def _serve_connection(self, conn: Connection) -> None:
        try:
            self.dispatcher.serve(conn)
        finally:
            conn.close()
            with self.conns_lock:
                self.conns.discard(conn)

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        """Stop what was started, in reverse; safe after a failed start."""
        if self.watcher:
            self.watcher.stop()
        if self.worker is not None and self.worker.is_alive():
            self.worker.stop()
            self.worker.join(timeout=60)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            self.sock_path.unlink(missing_ok=True)  # ours: bind() made it
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
