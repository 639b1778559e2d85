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
import stat
import struct
import threading
import time
from pathlib import Path

from ..engine import Engine, tokenizing
from ..errors import AlreadyRunning, Busy, ConfigError, DaemonError
from . import paths, test_hooks
from .dispatch import Dispatcher
from .framing import SEND_TIMEOUT, Connection, error
from .handlers import Handlers
from .worker import Worker

log = logging.getLogger("efim.daemon")
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 3600.0  # seconds a connection may stay silent before it is closed
FRAME_TIMEOUT = 10.0  # seconds one frame may take to arrive, from its first byte to its newline
MAX_RESTARTS = 3  # engine thread deaths within a minute before the daemon gives up
_UCRED = struct.Struct("3i")


def peer_uid(sock: socket.socket) -> int:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


def refuse(client: socket.socket, frame: bytes, linger: float = 0.0) -> None:
    """Best effort: tell a client why it is turned away, without raising. What it sent is read
    first: closing with unread data makes its side see ECONNRESET, not the reply. ``linger``: wait up
    to that long for its request and its close (else a client that connects, then sends, finds the
    socket closed: EPIPE before it reads the reply); 0: never block."""
    try:
        client.setblocking(False)
        client.send(frame)
        client.shutdown(socket.SHUT_WR)
        if linger:
            client.settimeout(linger)
        for _ in range(16):
            if not client.recv(1 << 16):
                break
    except OSError:
        pass
    finally:
        client.close()


REFUSING = threading.BoundedSemaphore(8)  # refusals that linger at once (a flood beyond is refused at once)
REFUSE_LINGER = 1.0  # seconds


def refuse_later(client: socket.socket, frame: bytes) -> None:
    """:func:`refuse`, lingering on a thread of its own, unless too many already do."""
    if not REFUSING.acquire(blocking=False):
        return refuse(client, frame)

    def run() -> None:
        try:
            refuse(client, frame, REFUSE_LINGER)
        finally:
            REFUSING.release()

    try:
        threading.Thread(target=run, name="efim-refuse", daemon=True).start()
    except RuntimeError:  # no more threads
        REFUSING.release()
        refuse(client, frame)


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
        self.deaths: list[float] = []  # when the engine thread died (the watchdog's count)
        self.watcher = None
        if watch:
            from .watcher import Watcher

            self.watcher = Watcher(lambda path: self.handlers.file_changed(path), ignored=paths.own_dirs())

    # -- socket lifecycle ---------------------------------------------------------------
    def bind(self) -> None:
        """Take the lock, replace a stale socket, refuse if another daemon answers.

        Only a socket of ours is ever replaced: any other file at the path (a typo in ``--socket``)
        is refused, not deleted. The directory is made private only if we create it."""
        d = self.sock_path.parent
        if not d.exists():
            d.mkdir(parents=True, mode=0o700)
            os.chmod(d, 0o700)  # mkdir's mode is masked by the umask
        self._check_target()  # before the lock file: a refused target leaves nothing beside it
        lock = Path(str(self.sock_path) + ".lock")
        self.lock_fd = paths.open_private(lock, os.O_RDWR)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AlreadyRunning(f"another efim daemon is running on {self.sock_path}") from None
        try:
            st = self._check_target()
        except ConfigError:  # it appeared meanwhile: ours is the lock, remove it
            lock.unlink(missing_ok=True)
            raise
        if st is not None:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.sock_path))
                raise AlreadyRunning(f"another efim daemon is running on {self.sock_path}")
            except (ConnectionRefusedError, FileNotFoundError):
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
        self.sock.listen(socket.SOMAXCONN)  # a burst of connections waits, not refused

    def _check_target(self) -> os.stat_result | None:
        """The socket path's status (None: free); refused unless it is a socket of ours."""
        try:
            st = os.lstat(self.sock_path)
        except FileNotFoundError:
            return None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise ConfigError(f"{self.sock_path} exists and is not an efim socket of yours; not replacing it")
        return st

    def attach(self, engine: Engine) -> None:
        """Give the server its engine (loaded after bind(), so a second daemon is refused fast)."""
        self.engine = engine
        self.worker = Worker(engine, self.queue_size)
        self.handlers = Handlers(self, engine, self.worker)
        self.dispatcher = Dispatcher(self.handlers.table())
        if self.watcher is not None and engine.store is not None:
            self.watcher.ignore(engine.store.dir)  # (a state_dir of its own: its files are not the workspace's)
        self.worker.follow.start()  # the engine's work at start (calibration)

    def serve_forever(self) -> None:
        self.worker.start()
        if self.watcher:
            self.watcher.start()
        self.sock.settimeout(0.5)
        try:
            while not self.stopping.is_set():
                self.watchdog()
                try:
                    client, _ = self.sock.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if e.errno in (errno.EBADF, errno.EINVAL):
                        break
                    log.warning("accept failed: %s", e)  # EMFILE and the like: wait, never die
                    time.sleep(0.1)
                    continue
                try:
                    self.accept(client)
                except OSError as e:  # EMFILE on dup() and the like: this client only
                    log.warning("a connection failed at accept: %s", e)
                    client.close()
                except Exception:  # noqa: BLE001 - one client never ends the accept loop
                    log.exception("a connection failed at accept")
                    client.close()
        finally:
            self.close()

    def watchdog(self) -> None:
        """Restart a dead engine thread; after ``MAX_RESTARTS`` deaths within a minute, give up with
        an error (the process exits non-zero, so ``efim daemon start`` can start a fresh one)."""
        if self.worker.is_alive() or self.stopping.is_set():
            return
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < 60] + [now]
        if len(self.deaths) > MAX_RESTARTS:
            log.error("the engine thread died %d times within a minute; exiting", len(self.deaths))
            raise DaemonError(f"the engine thread died {len(self.deaths)} times within a minute")
        log.error("the engine thread died; restarting it")
        self.worker.revive()

    def accept(self, client: socket.socket) -> None:
        uid = peer_uid(client)
        if uid != os.getuid():
            log.warning("refused a connection from uid %d", uid)
            client.close()
            return
        with self.conns_lock:
            full = len(self.conns) >= MAX_CONNECTIONS
        if full:
            refuse_later(client, error(None, Busy("busy: too many connections")))
            return
        conn = Connection(client, idle_timeout=IDLE_TIMEOUT, frame_timeout=test_hooks.seconds("FRAME", FRAME_TIMEOUT),
                          send_timeout=test_hooks.seconds("SEND", SEND_TIMEOUT))
        with self.conns_lock:
            self.conns.add(conn)
        try:
            threading.Thread(target=self._serve_connection, args=(conn,), name="efim-conn", daemon=True).start()
        except RuntimeError:  # no more threads: give its place back
            with self.conns_lock:
                self.conns.discard(conn)
            conn.close()
            raise

    def _serve_connection(self, conn: Connection) -> None:
        try:
            self.dispatcher.serve(conn)
        finally:
            conn.close()
            with self.conns_lock:
                self.conns.discard(conn)
            self.handlers.connection_closed(conn)

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        """Stop what was started, in reverse; safe after a failed start."""
        if self.watcher:
            self.watcher.stop()
        if self.worker is not None and self.worker.is_alive():
            self.worker.stop()
            self.worker.join(timeout=60)
        tokenizing.drain()  # a tokenize call idle work left running reads the model, freed next
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            self.sock_path.unlink(missing_ok=True)  # ours: bind() made it
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
