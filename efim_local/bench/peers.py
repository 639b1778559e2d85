"""The completion backends an edit-trace replay drives, each answering one :class:`Request`.

- :class:`EfimDaemon`: efim's own daemon over its Unix socket, EFIM or FIM layout.
- :class:`ServerInfill`: llama-server ``/infill`` with ``cache_prompt``, the request shape
  llama.vim sends (lines before the cursor line as ``input_prefix``, the cursor line's head as
  ``prompt``, the rest as ``input_suffix``).
- :class:`ServerCompletion`: llama-server ``/completion`` with the token list efim's planner builds
  for the EFIM layout, so the server's prompt cache sees the same stable prefix efim's does.

Every backend streams, so time to first token is measured by the client in the same way: the
time until the first piece of text arrives (or the answer ends, if it has none).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .util import spawn_daemon
from ..daemon.client import Client
from ..prompt.planner import FileSession
from .trace import Request

SERVER_BIN = Path(__file__).resolve().parent.parent.parent / "native" / "build" / "server" / "bin" / "llama-server"


@dataclass
class Answer:
    ttft_ms: float
    total_ms: float
    evaluated: int  # prompt tokens the backend computed (not served from its cache)
    text: str


class EfimDaemon:
    """efim's daemon, one per layout, on a private socket and state directory."""

    def __init__(self, model: Path, layout: str, n_ctx: int, threads: int, max_tokens: int):
        self.name = f"efim daemon {layout.upper()}"
        self.layout, self.max_tokens = layout, max_tokens
        self.proc, sock = spawn_daemon(model, None, "--layout", layout, "--n-ctx", str(n_ctx),
                                       "--threads", str(threads))
        self.client = Client(sock, timeout=600)

    def __call__(self, path: str, req: Request) -> Answer:
        first: list[float] = []
        t0 = time.perf_counter()
        res = self.client.call("complete", {"path": path, "text": req.text, "offset": req.offset,
                                            "max_tokens": self.max_tokens, "stream": True},
                               on_notification=lambda m: first or first.append(time.perf_counter()))
        t1 = time.perf_counter()
        return Answer(((first[0] if first else t1) - t0) * 1e3, (t1 - t0) * 1e3,
                      res["tokens"]["evaluated"], res["text"])

    def close(self) -> None:
        try:
            self.client.call("shutdown")
        except Exception:
            pass
        self.client.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server process on a loopback port, built by ``native/build_server.sh``.

    ``--swa-full`` keeps whole sliding-window caches so the prompt cache can be reused at any
    position, as efim's live slots do; ``--cache-reuse 256`` is llama.vim's recommended setting.
    """

    def __init__(self, binary: Path, model: Path, n_ctx: int, threads: int, parallel: int = 1, extra=()):
        """``n_ctx`` tokens per slot, ``parallel`` slots; ``extra``: more llama-server arguments."""
        if not binary.exists():
            raise FileNotFoundError(f"llama-server not found at {binary}: run `make server`")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                "-c", str(n_ctx * parallel), "-np", str(parallel), "--swa-full", "--cache-reuse", "256",
                "--no-webui", "-fa", "off", *extra]
        if threads:
            args += ["-t", str(threads)]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.get("/health").get("status") == "ok":
                    return
            except (OSError, ValueError, http.client.HTTPException):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server did not start; see {self.log.name}")
            time.sleep(0.2)

    def get(self, path: str) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read() or b"{}")
        finally:
            conn.close()

    def stream(self, path: str, body: dict) -> Answer:
        """POST with ``stream``; time to the first non-empty ``content`` and the final timings."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        first = None
        text, timings = [], {}
        try:
            conn.request("POST", path, json.dumps({**body, "stream": True}),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server {path}: HTTP {resp.status}: {resp.read()[:200]!r}")
            for line in resp:
                if not line.startswith(b"data: "):
                    continue
                msg = json.loads(line[6:])
                if msg.get("content"):
                    first = first or time.perf_counter()
                    text.append(msg["content"])
                if msg.get("stop"):
                    timings = msg.get("timings", {})
                    break
        finally:
            conn.close()
        t1 = time.perf_counter()
        return Answer(((first or t1) - t0) * 1e3, (t1 - t0) * 1e3, int(timings.get("prompt_n", -1)),
                      "".join(text))

    def kill(self) -> None:
        """Kill it at once (a replica that dies)."""
        self.proc.kill()
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        os.unlink(self.log.name)


SAMPLING = {"temperature": 0, "top_k": 1, "cache_prompt": True, "samplers": ["top_k"]}


class ServerInfill:
    name = "llama-server /infill"

    def __init__(self, server: LlamaServer, max_tokens: int):
        self.server, self.max_tokens = server, max_tokens

    def __call__(self, path: str, req: Request) -> Answer:
        line = req.text.rfind("\n", 0, req.offset) + 1
        return self.server.stream("/infill", {
            "input_prefix": req.text[:line], "prompt": req.text[line:req.offset],
            "input_suffix": req.text[req.offset:], "input_extra": [],
            "n_predict": self.max_tokens, **SAMPLING})

    def close(self) -> None:
        pass


class ServerCompletion:
    """``/completion`` with efim's EFIM token plan (planned here, with the same anchoring rules)."""

    name = "llama-server /completion EFIM"

    def __init__(self, server: LlamaServer, model: Path, n_ctx: int, max_tokens: int):
        from ..llama import Model
        from ..config import Config
        from ..engine.engine import make_planner

        self.server, self.max_tokens = server, max_tokens
        self.model = Model(model, vocab_only=True)
        cfg = Config(model=str(model), max_tokens=max_tokens).with_overrides(n_ctx_seq=n_ctx)
        _, self.planner = make_planner(self.model, cfg)
        self.sessions: dict[str, FileSession] = {}

    def __call__(self, path: str, req: Request) -> Answer:
        session = self.sessions.setdefault(path, FileSession(layout="efim"))
        plan = self.planner.plan(session, req.text, req.offset, "efim", reserve=self.max_tokens)
        return self.server.stream("/completion", {"prompt": list(plan.tokens),
                                                  "n_predict": self.max_tokens, **SAMPLING})

    def close(self) -> None:
        self.model.close()
