"""The Unix-socket server: owner-only access, one thread per connection."""

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

from ..document import MAX_DOCUMENT_BYTES
from ..backend._lib import library_info
from ..engine import CompletionRequest, Engine
from . import paths
from . import protocol as P
from .documents import Documents, position
from .worker import Job, Worker

log = logging.getLogger("efim.daemon")
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 3600.0  # seconds a connection may stay silent before it is closed
_UCRED = struct.Struct("3i")


class AlreadyRunning(RuntimeError):
    pass


def peer_uid(sock: socket.socket) -> int:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


class Connection:
    def __init__(self, server: "Server", sock: socket.socket):
        self.server, self.sock = server, sock
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

    def frames(self):
        """Yield complete lines; an over-long line yields None once and is skipped."""
        buf = bytearray()
        skipping = False
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > P.MAX_FRAME:
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
                if len(line) > P.MAX_FRAME:
                    yield None
                elif line.strip():
                    yield line

    def handle(self) -> None:
        try:
            for line in self.frames():
                if line is None:
                    self.send(P.error(None, P.RpcError(P.REQUEST_TOO_LARGE, f"request larger than {P.MAX_FRAME >> 20} MiB")))
                    continue
                self.dispatch(line)
        finally:
            self.alive = False
            try:
                self.sock.close()
            except OSError:
                pass
            self.server.forget(self)

    def dispatch(self, line: bytes) -> None:
        try:
            msg = P.parse(line)
        except P.RpcError as e:
            rid = e.data.get("id") if isinstance(e.data, dict) else None
            e.data = None
            self.send(P.error(rid, e))
            return
        try:
            handler = self.server.methods.get(msg.method)
            if handler is None:
                raise P.RpcError(P.METHOD_NOT_FOUND, f"method not found: {msg.method}")
            result = handler(self, msg)
            if result is not _DEFERRED and not msg.is_notification:
                self.send(P.reply(msg.id, result))
        except P.RpcError as e:
            if not msg.is_notification:
                self.send(P.error(msg.id, e))
        except Exception as e:  # a bug: answer, log, keep serving
            log.exception("request failed")
            if not msg.is_notification:
                self.send(P.error(msg.id, P.RpcError(P.INTERNAL_ERROR, f"internal error: {e.__class__.__name__}")))


_DEFERRED = object()  # the engine thread will reply


class Server:
    def __init__(self, sock_path: Path | None = None, queue_size: int = 16, watch: bool = True):
        self.sock_path = Path(sock_path or paths.socket_path())
        self.queue_size = queue_size
        self.engine: Engine | None = None
        self.worker: Worker | None = None
        self.documents = Documents()
        self.doc_lock = threading.Lock()
        self.conns: set[Connection] = set()
        self.conns_lock = threading.Lock()
        self.started = time.time()
        self.stopping = threading.Event()
        self.watcher = None
        if watch:
            from .watcher import Watcher

            self.watcher = Watcher(self.on_file_changed)
        self.methods = {
            "complete": self.m_complete, "didOpen": self.m_did_open, "didChange": self.m_did_change,
            "didClose": self.m_did_close, "cancel": self.m_cancel, "status": self.m_status,
            "shutdown": self.m_shutdown,
        }

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
        with self.conns_lock:
            if len(self.conns) >= MAX_CONNECTIONS:
                client.sendall(P.error(None, P.RpcError(P.BUSY, "busy: too many connections")))
                client.close()
                return
            conn = Connection(self, client)
            self.conns.add(conn)
        threading.Thread(target=conn.handle, name="efim-conn", daemon=True).start()

    def forget(self, conn: Connection) -> None:
        with self.conns_lock:
            self.conns.discard(conn)

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        if self.watcher:
            self.watcher.stop()
        if self.worker is not None and self.worker.is_alive():
            self.worker.stop()
            self.worker.join(timeout=60)
        try:
            self.sock.close()
        except OSError:
            pass
        self.sock_path.unlink(missing_ok=True)
        os.close(self.lock_fd)

    # -- methods -------------------------------------------------------------------------
    def m_complete(self, conn: Connection, msg: P.Message):
        p = msg.params
        path = P.get(p, "path", str)
        if len(path) > 4096:
            raise P.RpcError(P.INVALID_PARAMS, "invalid params: 'path' is too long")
        if "text" in p:
            text = P.get(p, "text", str)
            if len(text) > MAX_DOCUMENT_BYTES:
                raise P.RpcError(P.INVALID_PARAMS, "invalid params: document too large")
        else:
            with self.doc_lock:
                text = self.documents.get(path).text
        if "offset" in p:
            cursor = P.get(p, "offset", int, lo=0, hi=len(text))
        else:
            cursor = position(p, "position", text)
        layout = P.get(p, "layout", str, None)
        if layout not in (None, "efim", "fim"):
            raise P.RpcError(P.INVALID_PARAMS, "invalid params: 'layout' must be 'efim' or 'fim'")
        req = CompletionRequest(
            text=text, cursor=cursor, path=path,
            max_tokens=P.get(p, "max_tokens", int, None, lo=0, hi=4096),
            temperature=float(P.get(p, "temperature", (int, float), 0.0, lo=0, hi=5)),
            top_k=P.get(p, "top_k", int, 0, lo=0, hi=1000),
            top_p=float(P.get(p, "top_p", (int, float), 1.0, lo=0, hi=1)),
            seed=P.get(p, "seed", int, 0, lo=0, hi=(1 << 32) - 1),
            layout=layout,
            stop_at_newline=P.get(p, "stop_at_newline", bool, False),
            max_lines=P.get(p, "max_lines", int, None, lo=1, hi=1000),
            heal=P.get(p, "heal", bool, False),
            sparse=P.get(p, "sparse", bool, None))
        if msg.is_notification:
            raise P.RpcError(P.INVALID_REQUEST, "complete needs an id")
        self.worker.submit(Job(msg.id, path, req, conn, stream=P.get(p, "stream", bool, False)))
        return _DEFERRED

    def m_did_open(self, conn, msg):
        with self.doc_lock:
            doc = self.documents.open(msg.params)
        root = P.get(msg.params, "root", str, None)
        if self.watcher and root:
            self.watcher.watch(root)
        self._warm_later(doc.path)
        return {"path": doc.path, "version": doc.version}

    def m_did_change(self, conn, msg):
        with self.doc_lock:
            doc = self.documents.change(msg.params)
        return {"path": doc.path, "version": doc.version}

    def m_did_close(self, conn, msg):
        with self.doc_lock:
            self.documents.close(msg.params)
        return None

    def m_cancel(self, conn, msg):
        rid = msg.params.get("id")
        if not P.valid_id(rid):
            raise P.RpcError(P.INVALID_PARAMS, "invalid params: 'id' must be a request id")
        return {"cancelled": self.worker.cancel(conn, rid)}

    def m_status(self, conn, msg):
        return self.status()

    def m_shutdown(self, conn, msg):
        threading.Timer(0.05, self.stop).start()
        return {"stopping": True}

    # -- status, watching, idle prefill -----------------------------------------------------
    def status(self) -> dict:
        def snapshot(e: Engine) -> dict:
            return {
                "model": str(e.model.path), **library_info(), "layout": e.default_layout,
                "swa_strategy": e.swa_strategy, "sparse_restore": e.sparse_status(), "slots": [{"slot": s.seq, "path": s.path, "tokens": len(s.tokens)} for s in e.slots.slots],
                "store": e.store.stats() if e.store else None,
            }

        info = self.worker.call(snapshot)
        with self.doc_lock:
            n_docs = len(self.documents.docs)
        info.update({"socket": str(self.sock_path), "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 1),
                     "queued": self.worker.queued(), "served": self.worker.served, "errors": self.worker.errors,
                     "documents": n_docs, "watching": self.watcher.roots() if self.watcher else []})
        return info

    def on_file_changed(self, path: str) -> None:
        """A file changed on disk: forget its plan state and prefill it in idle time."""
        self.worker.post(lambda e: e.sessions.pop(path, None))
        self._warm_later(path)

    def _warm_later(self, path: str) -> None:
        def warm(engine: Engine, should_stop) -> None:
            with self.doc_lock:
                doc = self.documents.docs.get(path)
                text = doc.text if doc else None
            if text is None:
                try:
                    from ..document import read_source

                    text = read_source(path)
                except Exception:
                    return
            cursor = min(self.worker.cursors.get(path, len(text)), len(text))
            engine.complete(CompletionRequest(text, cursor, path=path, max_tokens=0), should_stop=should_stop)

        self.worker.add_idle(warm)
