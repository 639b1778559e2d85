"""Latency that `efim lsp` adds to a fully cached completion (`efim bench lsp`).

A real daemon and a real `efim lsp` subprocess (stdio, Content-Length frames, as an editor runs it).
The same completion (same document, same cursor: every prompt token cached in the slot) is asked for
through the LSP (textDocument/inlineCompletion). Relay latency = the editor's LSP round trip - the
daemon's round trip for the same request (timed by the relay around its socket call and reported in
the efim/status notification); target p50 <= 3 ms. For reference, the same completion is also asked
straight from the daemon's socket after each LSP request (``direct``): on a loaded machine the
difference of two separate requests is mostly noise, hence the same-request measure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu

TARGET_P50_MS = 3.0


@dataclass
class LspConfig:
    model: str = "default"
    requests: int = 100
    max_tokens: int = 8
    out: Path = bu.RESULTS


class StdioLsp:
    """A minimal blocking LSP client (no asyncio on this side: it would add its own latency)."""

    def __init__(self, args: list[str], env: dict):
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.next_id = 0
        self.notifications: list[dict] = []

    def send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def read(self) -> dict:
        length = 0
        while (line := self.proc.stdout.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(self.proc.stdout.read(length))

    def request(self, method: str, params: dict | None):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg.get("id") == self.next_id and "method" not in msg:
                if "error" in msg:
                    raise SystemExit(f"{method}: {msg['error']}")
                return msg.get("result")
            if "method" in msg and "id" not in msg:
                self.notifications.append(msg)
            elif "method" in msg:  # a request from the server (none expected): answer null
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})

    def notify(self, method: str, params: dict | None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self) -> None:
        self.request("shutdown", None)
        self.notify("exit", None)
        self.proc.wait(30)


def run(cfg: LspConfig, log=print) -> dict:
    from ..daemon.client import Client

    proc, sock = bu.spawn_daemon(*bu.bench_model(cfg.model), config={"max_prompt_ms": 0})
    path = str(Path(os.__file__).resolve())
    text = Path(path).read_text()[:12000]
    line = text[:8000].count("\n")
    uri = Path(path).as_uri()
    lsp = StdioLsp([sys.executable, "-m", "efim_local.cli", "lsp", "--socket", str(sock)], dict(os.environ))
    lsp.request("initialize", {"processId": os.getpid(), "capabilities": {}, "rootUri": None,
                               "initializationOptions": {"maxTokens": cfg.max_tokens}})
    lsp.notify("initialized", {})
    lsp.notify("textDocument/didOpen",
               {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
    inline = {"textDocument": {"uri": uri}, "position": {"line": line, "character": 0}, "context": {"triggerKind": 1}}
    direct = {"path": path, "position": {"line": line, "character": 0}, "max_tokens": cfg.max_tokens}
    rows = []
    load_before = os.getloadavg()
    try:
        with Client(sock, timeout=300) as c:
            for _ in range(3):  # warm: the slot holds the whole prompt
                lsp.request("textDocument/inlineCompletion", inline)
                c.call("complete", direct)
            for _ in tqdm(range(cfg.requests), desc="lsp", disable=log is None):
                t = time.perf_counter()
                items = lsp.request("textDocument/inlineCompletion", inline)["items"]
                t_lsp = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                out = c.call("complete", direct)
                t_daemon = (time.perf_counter() - t) * 1e3
                st = lsp.notifications[-1]["params"]
                if out["tokens"]["evaluated"] > 1 or st["tokens"]["evaluated"] > 1:
                    raise SystemExit(f"the completion was not cached: {out['tokens']}, {st['tokens']}")
                if not items or not items[0]["insertText"].endswith(out["text"]):
                    raise SystemExit(f"the LSP and the daemon answered differently: {items}, {out['text']!r}")
                rows.append({"lsp": t_lsp, "daemon_rtt": st["daemon_rtt_ms"], "relay": t_lsp - st["daemon_rtt_ms"],
                             "direct": t_daemon})
            busy = bu.busiest(6)
            lsp.close()
            c.call("shutdown")
        proc.wait(60)
    finally:  # (after a failure: whatever still runs)
        for pr in (lsp.proc, proc):
            if pr.poll() is None:
                pr.terminate()
                pr.wait(60)

    p = lambda key, q: bu.pctl([r[key] for r in rows], q)  # noqa: E731
    row = {"model": cfg.model, "requests": len(rows), "prompt_tokens": out["tokens"]["prompt"],
           "p50_lsp_ms": p("lsp", 0.5), "p50_daemon_rtt_ms": p("daemon_rtt", 0.5), "p50_direct_ms": p("direct", 0.5),
           "p50_relay_ms": p("relay", 0.5), "p95_relay_ms": p("relay", 0.95), "target_p50_ms": TARGET_P50_MS}
    load_after = os.getloadavg()
    res = {"args": bu.options(cfg), "result": row, "rows": rows, "load_average": [load_before, load_after],
           "busiest": busy}
    res["json"] = str(bu.save(f"lsp-relay-{bu.model_name(cfg.model)}", res, cfg.out))
    if log is not None:
        log(bu.table([row], list(row)))
        log(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; busiest processes: {busy}")
    return res
