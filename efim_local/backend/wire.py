"""HTTP to a replica with the standard library only: JSON calls and server-sent event streams.

``https`` URLs are verified with the system's CA store (``ssl.create_default_context``). The API
key goes in an ``Authorization: Bearer`` header and nowhere else: a replica prints as its URL.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from urllib.parse import urlsplit

from ..config import check_url
from ..errors import BackendError, one_line

CONNECT_TIMEOUT = 3.0  # seconds to connect; the editor never waits on a dead replica longer
READ_TIMEOUT = 60.0  # seconds between two events of a stream (a long prompt's prefill)


class ReplicaError(BackendError):
    """A replica did not answer (``reason``: connect, timeout, http_<status>, protocol, closed,
    server_error); ``detail``: what was wrong with a reply that broke the protocol (one short line)."""

    def __init__(self, message: str, reason: str, detail: str = ""):
        super().__init__(message)
        self.reason, self.detail = reason, detail


class Replica:
    """One server: its URL, its key (never printed), and fresh connections to it."""

    def __init__(self, url: str, api_key: str | None = None):
        self.url = check_url(url)
        parts = urlsplit(self.url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self._key = api_key[:] if api_key else None  # [:]: the plain string of a config.Secret

    def __repr__(self) -> str:
        return f"Replica({self.url!r})"

    def connect(self, timeout: float = CONNECT_TIMEOUT) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra: dict | None = None) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self._key:
            h["Authorization"] = f"Bearer {self._key}"
        return {**h, **(extra or {})}

    def get_json(self, path: str, timeout: float = CONNECT_TIMEOUT) -> dict:
        """GET ``path``; its JSON body (ReplicaError if it fails)."""
        conn = self.connect(timeout)
        try:
            conn.request("GET", self.base + path, headers=self.headers())
            resp = conn.getresponse()
            body = resp.read(1 << 20)
            if resp.status != 200:
                raise ReplicaError(f"{self.url}{path}: HTTP {resp.status}", f"http_{resp.status}")
            return json.loads(body or b"{}")
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
            raise _error(self, path, e) from None
        finally:
            conn.close()

    def post_json(self, path: str, body: dict, timeout: float = READ_TIMEOUT) -> dict:
        """POST ``body`` to ``path``; its JSON answer (ReplicaError if it fails)."""
        conn = self.connect(CONNECT_TIMEOUT)
        try:
            conn.request("POST", self.base + path, json.dumps(body), self.headers())
            conn.sock.settimeout(timeout)
            resp = conn.getresponse()
            data = resp.read(1 << 20)
            if resp.status != 200:
                detail = data[:300].decode("utf-8", "replace").strip()
                raise ReplicaError(f"{self.url}{path}: HTTP {resp.status}: {detail[:200]}", f"http_{resp.status}")
            return json.loads(data or b"{}")
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
            raise _error(self, path, e) from None
        finally:
            conn.close()

    def stream(self, path: str, body: dict, headers: dict | None = None,
               read_timeout: float = READ_TIMEOUT) -> "EventStream":
        """POST ``body`` and open its event stream (ReplicaError if it cannot be opened)."""
        conn = self.connect()
        try:
            conn.request("POST", self.base + path, json.dumps(body), self.headers(headers))
            conn.sock.settimeout(read_timeout)
            resp = conn.getresponse()
            if resp.status != 200:
                detail = resp.read(300).decode("utf-8", "replace").strip()
                raise ReplicaError(f"{self.url}{path}: HTTP {resp.status}: {detail[:200]}", f"http_{resp.status}")
        except BaseException as e:
            conn.close()
            if isinstance(e, ReplicaError):
                raise
            if isinstance(e, (OSError, http.client.HTTPException)):
                raise _error(self, path, e) from None
            raise
        return EventStream(self, conn, resp)


def _error(replica: Replica, path: str, e: BaseException) -> ReplicaError:
    # (RecursionError: JSON nested too deep for the decoder)
    reason = ("timeout" if isinstance(e, (socket.timeout, TimeoutError)) else
              "tls" if isinstance(e, ssl.SSLError) else
              "protocol" if isinstance(e, (ValueError, http.client.HTTPException, RecursionError)) else "connect")
    what = one_line(f"{type(e).__name__}: {e}")[:200]
    return ReplicaError(f"{replica.url}{path}: {what}", reason, what if reason == "protocol" else "")


class EventStream:
    """The ``data:`` events of a server-sent event stream, as JSON objects; ``close()`` (from any
    thread) cancels it: the server sees the connection close and stops generating."""

    def __init__(self, replica: Replica, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.replica, self.conn, self.resp = replica, conn, resp
        self.closed = False

    def __iter__(self):
        try:
            if "json" in (self.resp.getheader("Content-Type") or ""):  # a whole answer, not a stream
                msg = json.loads(self.resp.read(1 << 24))
                yield msg
                return
            while True:
                line = self.resp.readline(1 << 22)
                if not line:
                    if self.closed:
                        return
                    raise ReplicaError(f"{self.replica.url}: the stream ended early", "closed")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                msg = json.loads(data)
                if isinstance(msg, dict) and "error" in msg:
                    err = msg["error"]
                    text = err.get("message", err) if isinstance(err, dict) else err
                    raise ReplicaError(one_line(f"{self.replica.url}: {text}")[:300], "server_error")
                yield msg
        except Exception as e:  # noqa: BLE001 - closed from another thread: http.client fails in many ways
            if self.closed:
                return
            if isinstance(e, (OSError, http.client.HTTPException, ValueError, RecursionError)):
                raise _error(self.replica, "", e) from None
            raise

    def close(self) -> None:
        """Stop the stream (idempotent; safe from another thread)."""
        self.closed = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()
