"""Instant answers (issue 24), measured against a real daemon: a user who types the suggestion through
and accepts it.

For each cursor (standard-library files, a line start), the script opens the file in the daemon,
asks for a completion, then:

- types the suggestion through: ``--keys`` keystrokes, each the next character of the suggestion
  shown (didChange, then complete, ``--key-ms`` apart), and records the answer's source, its
  evaluated prompt tokens, the daemon's time (``timings.total_ms``) and the round trip at the client;
- accepts: waits ``--read-ms`` (the ghost is shown: the daemon computes ahead meanwhile), inserts
  the whole suggestion (Tab), sends ``accepted`` and asks again, and records the same.

Prints the share of type-through keystrokes answered with 0 evaluated tokens, their p50/p95 (daemon
and client), and the share of accepts whose next suggestion was ready within 5 ms.

    python scripts/bench_instant.py                       # the bundled model
    python scripts/bench_instant.py --model gemma --cursors 12
"""

import argparse
import json
import time

from efim_local.bench import util as bu
from efim_local.daemon.client import Client
from efim_local.daemon.logs import percentile

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--fim-template", help="text markers for a model without FIM tokens, e.g. '<PRE>,<SUF>,<MID>'")
ap.add_argument("--cursors", type=int, default=12)
ap.add_argument("--keys", type=int, default=8, help="keystrokes typed through per cursor")
ap.add_argument("--key-ms", type=float, default=120.0, help="time between keystrokes")
ap.add_argument("--read-ms", type=float, default=400.0, help="time the ghost is shown before an accept")
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--json", help="write the numbers to this file")
args = ap.parse_args()

model, template = bu.bench_model(args.model)
template = args.fim_template or template
proc, sock = bu.spawn_daemon(model, template, "--n-ctx", "4096", config={"max_prompt_ms": 0})
REPLACEMENT = "\ufffd"


class Editor:
    def __init__(self, c, path, text):
        self.c, self.path, self.text, self.version = c, path, text, 1
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
                                       "max_tokens": args.max_tokens})
        out["client_ms"] = (time.perf_counter() - t) * 1e3
        return out


def cursors(n):
    from efim_local.training.corpus import read_texts, stdlib_files

    texts = [t for t in read_texts(stdlib_files(3_000_000)) if 4000 < len(t) < 60_000]
    for i in range(n):
        text = texts[(i * 7) % len(texts)]
        at = text.index("\n", int(len(text) * (0.2 + 0.6 * ((i * 37) % 100) / 100))) + 1
        at += len(text[at:]) - len(text[at:].lstrip(" "))  # after the indentation
        yield f"/bench/instant/{i}.py", text, at


keys, accepts = [], []
try:
    with Client(sock, timeout=300) as c:
        for path, text, cur in cursors(args.cursors):
            ed = Editor(c, path, text)
            out = ed.complete(cur)
            for _ in range(args.keys):
                ch = out["text"][:1]
                if not ch or ch == REPLACEMENT:
                    break
                time.sleep(args.key_ms / 1e3)
                ed.insert(cur, ch)
                cur += 1
                out = ed.complete(cur)
                out["typed"] = ch
                keys.append(out)
            if out["text"] and REPLACEMENT not in out["text"]:
                time.sleep(args.read_ms / 1e3)
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


def ms(rows, key):
    vals = [r["timings"]["total_ms"] if key == "daemon" else r["client_ms"] for r in rows]
    return {"p50": percentile(vals, 50), "p95": percentile(vals, 95)}


zero = sum(r["tokens"]["evaluated"] == 0 and r["source"] in ("type-through", "accept") for r in keys)
ready = sum(r["timings"]["total_ms"] <= 5 for r in accepts)
report = {
    "model": str(model), "cursors": args.cursors, "max_tokens": args.max_tokens,
    "type_through": {"keystrokes": len(keys), "zero_evaluated": zero, "share": round(zero / max(1, len(keys)), 3),
                     "daemon_ms": ms(keys, "daemon"), "client_ms": ms(keys, "client")},
    "accept": {"accepts": len(accepts), "ready_5ms": ready, "share": round(ready / max(1, len(accepts)), 3),
               "from_accept": sum(r["source"] == "accept" for r in accepts),
               "daemon_ms": ms(accepts, "daemon"), "client_ms": ms(accepts, "client")},
    "sources": status["requests"]["sources"],
    "misses": [(r["typed"], r["source"], r["tokens"]["evaluated"]) for r in keys
               if r["tokens"]["evaluated"] or r["source"] not in ("type-through", "accept")],
}
print(json.dumps(report, indent=1))
if args.json:
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
