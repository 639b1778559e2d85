"""What every attack uses: the target daemon, a raw connection, and the checks."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from efim_local.daemon.client import Client


class Failed(AssertionError):
    """The daemon did not hold."""


class Skipped(Exception):
    """The attack cannot run against this daemon."""


@dataclass
class Target:
    """A daemon to attack: its socket, its deadlines (seconds) and a scratch directory."""

    sock: Path
    frame_timeout: float = 10.0
    send_timeout: float = 10.0
    max_connections: int = 64
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="efim-attack-")))


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


class Raw(Client):
    """A raw connection: any frame out (JSON escapes surrogates, so they reach the daemon), and each
    reply as it came, errors included."""

    def send(self, obj: dict | bytes) -> None:
        self.sock.sendall(obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n")

    def exchange(self, method: str, params: dict | None = None, rid=1) -> dict:
        """One request; its reply (result or error), skipping streamed notifications."""
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        while True:
            msg = self.read()
            if "id" in msg:
                return msg


def small_complete(t: Target, path: str = "attack-probe.py", timeout: float = 30.0) -> float:
    """A completion on a small document; its wall time (s). Fails unless it is answered."""
    t0 = time.monotonic()
    with Raw(t.sock, timeout) as c:
        r = c.exchange("complete", {"path": str(t.tmp / path), "text": "def f(x):\n    return x\n", "offset": 10,
                                "max_tokens": 2})
    check("result" in r, f"a completion after the attack failed: {r.get('error')}")
    return time.monotonic() - t0


def status(t: Target) -> dict:
    with Raw(t.sock, 30) as c:
        r = c.exchange("status")
    check("result" in r, f"status failed: {r.get('error')}")
    return r["result"]


def error_code(reply: dict) -> int | None:
    return reply.get("error", {}).get("code")


