"""A small client for the daemon's socket API, for editors' helpers, tools and the CLI."""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path
from typing import Any, Callable

from . import paths
from ..errors import DaemonUnavailable, EfimError, from_wire
from .framing import request


class Client:
    """One connection; ``call`` sends a request and waits for its reply."""

    def __init__(self, sock_path: str | Path | None = None, timeout: float | None = 60.0):
        self.path = str(sock_path or paths.socket_path())
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
        except OSError as e:
            self.sock.close()
            raise DaemonUnavailable(f"no efim daemon at {self.path} ({e.strerror or e})") from None
        self.file = self.sock.makefile("rb")
        self.ids = itertools.count(1)

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, obj: dict) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict:
        line = self.file.readline()
        if not line:
            raise DaemonUnavailable("the daemon closed the connection")
        return json.loads(line)

    def call(self, method: str, params: dict | None = None,
             on_notification: Callable[[dict], Any] | None = None) -> Any:
        rid = next(self.ids)
        self.sock.sendall(request(rid, method, params))
        while True:
            msg = self.read()
            if "id" not in msg:
                if on_notification:
                    on_notification(msg)
                continue
            if msg["id"] != rid:
                continue
            if "error" in msg:
                raise from_wire(msg["error"])
            return msg["result"]

    def notify(self, method: str, params: dict | None = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params or {}})


def running(sock_path: str | Path | None = None) -> bool:
    try:
        with Client(sock_path, timeout=2) as c:
            c.call("status")
        return True
    except (OSError, EfimError, ValueError):
        return False
