"""Instant answers (issue 24), measured against a real daemon (`efim bench instant`): a user who types
the suggestion through and accepts it.

For each cursor (standard-library files, a line start), it opens the file in the daemon, asks for a
completion, then:

- types the suggestion through: ``keys`` keystrokes, each the next character of the suggestion
  shown (didChange, then complete, ``key_ms`` apart), and records the answer's source, its evaluated
  prompt tokens, the daemon's time (``timings.total_ms``) and the round trip at the client;
- accepts: waits ``read_ms`` (the ghost is shown: the daemon computes ahead meanwhile), inserts the
  whole suggestion (Tab), sends ``accepted`` and asks again, and records the same.

The report: the share of type-through keystrokes answered with 0 evaluated tokens, their p50/p95
(daemon and client), and the share of accepts whose next suggestion was ready within 5 ms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm import tqdm

from . import util as bu

REPLACEMENT = "\ufffd"


@dataclass
class InstantConfig:
    model: str = "default"
    fim_template: str | None = None  # text markers for a model without FIM tokens
    cursors: int = 12
    keys: int = 8  # keystrokes typed through per cursor
    key_ms: float = 120.0  # time between keystrokes
    read_ms: float = 400.0  # time the ghost is shown before an accept
    max_tokens: int = 32


class Editor:
    """One open file, edited and completed through the daemon's socket."""

    def __init__(self, c, path, text, max_tokens):
        self.c, self.path, self.text, self.version, self.max_tokens = c, path, text, 1, max_tokens
        c.call("didOpen", {"path": path, "text": text, "version": 1})

    def insert(self, at, s):
        line = self.text.count("\n", 0, at)
        pos = {"line": line, "character": at - (self.text.rfind("\n", 0, at) + 1)}
        self.version += 1
        self.c.call("didChange", {"path": self.path, "version": self.version,
                                  "contentChanges": [{"range": {"start": pos, "end": pos}, "text": s}]})
        self.text = self.text[:at] + s + self.text[at:]

    def complete(self, at):
        t = time.perf_counter()
        out = self.c.call("complete", {"path": self.path, "offset": at, "version": self.version,
                                       "max_tokens": self.max_tokens})
        out["client_ms"] = (time.perf_counter() - t) * 1e3
        return out


def cursors(n):
    from ..training.corpus import read_texts, stdlib_files

    texts = [t for t in read_texts(stdlib_files(3_000_000)) if 4000 < len(t) < 60_000]
    for i in range(n):
        text = texts[(i * 7) % len(texts)]
        at = text.index("\n", int(len(text) * (0.2 + 0.6 * ((i * 37) % 100) / 100))) + 1
        at += len(text[at:]) - len(text[at:].lstrip(" "))  # after the indentation
        yield f"/bench/instant/{i}.py", text, at


def run(cfg: InstantConfig, progress: bool = True) -> dict:
    from ..daemon.client import Client

    model, template = bu.bench_model(cfg.model)
    template = cfg.fim_template or template
    proc, sock = bu.spawn_daemon(model, template, "--n-ctx", "4096", config={"max_prompt_ms": 0})
    keys, accepts = [], []
    try:
        with Client(sock, timeout=300) as c:
            for path, text, cur in tqdm(cursors(cfg.cursors), total=cfg.cursors, desc="instant",
                                        disable=not progress):
                ed = Editor(c, path, text, cfg.max_tokens)
                out = ed.complete(cur)
                for _ in range(cfg.keys):
                    ch = out["text"][:1]
                    if not ch or ch == REPLACEMENT:
                        break
                    time.sleep(cfg.key_ms / 1e3)
                    ed.insert(cur, ch)
                    cur += 1
                    out = ed.complete(cur)
                    out["typed"] = ch
                    keys.append(out)
                if out["text"] and REPLACEMENT not in out["text"]:
                    time.sleep(cfg.read_ms / 1e3)
                    ed.insert(cur, out["text"])
                    c.call("accepted", {"path": path, "id": "0", "text": out["text"], "accepted": len(out["text"])})
                    cur += len(out["text"])
                    accepts.append(ed.complete(cur))
                c.call("didClose", {"path": path})
            status = c.call("status")
    finally:
        with Client(sock, timeout=30) as c:
            c.call("shutdown")
        proc.wait(60)
    return report(cfg, model, keys, accepts, status)


def report(cfg: InstantConfig, model, keys: list[dict], accepts: list[dict], status: dict) -> dict:
    from ..daemon.logs import percentile

    def ms(rows, key):
        vals = [r["timings"]["total_ms"] if key == "daemon" else r["client_ms"] for r in rows]
        return {"p50": percentile(vals, 50), "p95": percentile(vals, 95)}

    zero = sum(r["tokens"]["evaluated"] == 0 and r["source"] in ("type-through", "accept") for r in keys)
    ready = sum(r["timings"]["total_ms"] <= 5 for r in accepts)
    return {
        "model": str(model), "cursors": cfg.cursors, "max_tokens": cfg.max_tokens,
        "type_through": {"keystrokes": len(keys), "zero_evaluated": zero,
                         "share": round(zero / max(1, len(keys)), 3),
                         "daemon_ms": ms(keys, "daemon"), "client_ms": ms(keys, "client")},
        "accept": {"accepts": len(accepts), "ready_5ms": ready, "share": round(ready / max(1, len(accepts)), 3),
                   "from_accept": sum(r["source"] == "accept" for r in accepts),
                   "daemon_ms": ms(accepts, "daemon"), "client_ms": ms(accepts, "client")},
        "sources": status["requests"]["sources"],
        "misses": [(r["typed"], r["source"], r["tokens"]["evaluated"]) for r in keys
                   if r["tokens"]["evaluated"] or r["source"] not in ("type-through", "accept")],
    }
