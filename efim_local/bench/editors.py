"""The editors of the paced replay: what an editor sends each backend, and when it gives up.

- :class:`EfimEditor`: efim's daemon with synced documents, cursor notifications and cancels.
- :class:`InfillEditor`: llama-server ``/infill`` the way llama.vim calls it.

Both take the events and requests that the paced replay (paced.py) makes of a trace: :class:`Step`
and :class:`Fired`, defined here so that the replay imports the editors and not the other way round.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Step:
    """The document after one editor event at time ``t`` (seconds from the start)."""

    t: float
    path: str
    kind: str  # open | jump | key | over (typed over an auto-inserted closer) | cleanup
    doc: str
    cursor: int
    change: tuple[int, int, str] | None = None  # (start, end, text) in the previous document


@dataclass
class Fired:
    """A completion request the editor fired at step ``step``."""

    step: int
    t: float  # scheduled time
    path: str
    doc: str
    cursor: int
    next_key_t: float  # when the user types on: an answer after this is stale


def _position(doc: str, offset: int) -> dict:
    line = doc.count("\n", 0, offset)
    return {"line": line, "character": offset - (doc.rfind("\n", 0, offset) + 1)}


@dataclass
class Outcome:
    """What the editor saw of one request: ``t_first`` is when the first streamed text arrived at the
    client (None: no text before the answer ended or was cancelled); ``t_first_derived`` is the older
    estimate from the backend's own timings (the end of its prefill), kept for comparison."""

    t_send: float
    t_first: float | None = None
    t_first_derived: float | None = None
    t_done: float | None = None
    cancelled: bool = False
    context: dict = field(default_factory=dict)
    evaluated: int | None = None
    cached: int | None = None  # efim: prompt tokens its KV held (the repository context's must be among them)
    reanchor: str | None = None
    wait_ms: float | None = None  # round trip less the backend's own time: queueing and IPC
    source: str | None = None  # efim: computed, type-through, accept or cache (docs/protocol.md)
    text: str = ""  # the answer (efim; the simulated user of bench/user.py reads it)
    replaces: int = 0  # characters after the cursor it replaces: the closers it typed over (type_over)
    pieces: list = field(default_factory=list)  # (time, text) of each piece streamed: the ghost as it grew
    total_ms: float | None = None  # the daemon's own time for it


def displayed(trace_steps: list[Step], fired: list[Fired], outcomes: list[Outcome], t0: float) -> list[str]:
    """What the editor shows at each request's next key: the request's own text streamed so far, or
    the rest of an earlier ghost the user typed through (Neovim's and VS Code's ghosts stay, shortened,
    while the user types their next characters; any other change dismisses them). A request's text
    replaces the ghost unless the ghost already shows more of it (the Neovim plugin's rule)."""
    events = [(s.t, 1, "key", i) for i, s in enumerate(trace_steps)]
    events += [(f.t, 2, "fire", j) for j, f in enumerate(fired)]
    events += [(t - t0, 3, "piece", (j, k)) for j, o in enumerate(outcomes) if o for k, (t, _) in enumerate(o.pieces)]
    events += [(f.next_key_t, 0, "look", j) for j, f in enumerate(fired)]  # just before the key
    out = [""] * len(fired)
    ghost = None  # (text, path, cursor)
    latest = -1
    for _, _, kind, x in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == "look":
            f = fired[x]
            out[x] = ghost[0] if ghost and ghost[1:] == (f.path, f.cursor) else ""
        elif kind == "fire":
            latest = x
        elif kind == "piece":
            j, k = x
            f = fired[j]
            if j != latest or (t0 + f.next_key_t) < outcomes[j].pieces[k][0]:
                continue  # cancelled by a key: the editor drops it
            text = "".join(p for _, p in outcomes[j].pieces[:k + 1])
            if not (ghost and ghost[1:] == (f.path, f.cursor) and ghost[0].startswith(text)):
                ghost = (text, f.path, f.cursor)
        else:
            s = trace_steps[x]
            if s.kind == "over":  # typed over a closer: the caret steps past it, the text stays
                typed, at = s.doc[s.cursor - 1:s.cursor], s.cursor - 1
            elif s.kind == "key" and s.change and s.change[0] == s.change[1]:
                typed, at = s.change[2], s.change[0]
            else:
                typed, at = "", None
            if (typed and ghost and s.path == ghost[1] and at == ghost[2] and s.cursor == at + len(typed)
                    and len(typed) < len(ghost[0]) and ghost[0].startswith(typed)):
                ghost = (ghost[0][len(typed):], s.path, s.cursor)
            else:
                ghost = None
    return out


class EfimEditor:
    """An editor talking to efim's daemon: synced documents, cursor notifications, cancelling."""

    name = "efim"

    def __init__(self, sock: Path, max_tokens: int):
        from ..daemon.client import Client

        self.sock, self.max_tokens = sock, max_tokens
        self.ctl = Client(sock, timeout=60)
        self.version = 0
        self.versions: dict[int, int] = {}  # id(a step's document) -> its version (the steps keep them alive)
        self.running: dict[int, object] = {}  # thread id -> its client, while its request runs

    def event(self, step: Step, prev: Step | None) -> None:
        if step.kind == "open":
            self.ctl.call("didOpen", {"path": step.path, "text": step.doc, "version": 0})
            self.versions[id(step.doc)] = 0
            return
        if step.change is not None:
            s, e, text = step.change
            self.version += 1
            doc = prev.doc
            self.ctl.call("didChange", {"path": step.path, "version": self.version, "contentChanges": [
                {"range": {"start": _position(doc, s), "end": _position(doc, e)}, "text": text}]})
            self.versions[id(step.doc)] = self.version
        if prev is None or prev.doc.count("\n", 0, prev.cursor) != step.doc.count("\n", 0, step.cursor) \
                or step.kind == "jump":
            self.ctl.notify("cursor", {"path": step.path, "offset": step.cursor})

    def fire(self, req: Fired, out: Outcome) -> None:
        from ..daemon.client import Client
        from ..errors import Cancelled, InvalidParams

        def on_partial(msg: dict) -> None:
            if msg.get("method") == "completion/partial" and msg["params"].get("text"):
                out.pieces.append((time.perf_counter(), msg["params"]["text"]))
                if out.t_first is None:
                    out.t_first = out.pieces[-1][0]

        with Client(self.sock, timeout=600) as c:
            self.running[threading.get_ident()] = c
            try:
                # The version of the text the request was made on, as editors send it: the request
                # runs on its own connection, so the next keystroke's didChange may reach the daemon
                # first, and without it the old position would be read in the new text.
                res = c.call("complete", {"path": req.path, "position": _position(req.doc, req.cursor),
                                          "version": self.versions[id(req.doc)],
                                          "max_tokens": self.max_tokens, "type_over": True, "stream": True},
                                  on_notification=on_partial)
            except InvalidParams as e:  # the user typed on before the request got there: stale
                if "version" not in str(e):
                    raise
                out.cancelled = True
                return
            except Cancelled as e:  # superseded; it says how far it got if it had started generating
                out.cancelled = True
                if isinstance(e.data, dict):  # its plan, if it had one; its prefill, if it had finished it
                    out.context, out.reanchor = e.data.get("context", {}), e.data.get("reanchor")
                    if "timings" in e.data:
                        out.t_first_derived = out.t_send + e.data["timings"]["prompt_ms"] / 1e3
                        out.evaluated, out.cached = e.data["tokens"]["evaluated"], e.data["tokens"]["cached"]
                return
            finally:
                self.running.pop(threading.get_ident(), None)
        out.t_done = time.perf_counter()
        tm = res["timings"]
        out.t_first_derived = out.t_done - tm["predict_ms"] / 1e3
        out.wait_ms = (out.t_done - out.t_send) * 1e3 - tm["total_ms"]
        out.context, out.evaluated, out.reanchor = res.get("context", {}), res["tokens"]["evaluated"], res["reanchor"]
        out.cached = res["tokens"]["cached"]
        out.source = res.get("source")
        out.text, out.total_ms, out.replaces = res.get("text", ""), tm.get("total_ms"), res.get("replaces", 0)

    def cancel(self, older: threading.Thread) -> None:
        """The user typed on: cancel the request if it still runs (its id is 1 on its connection)."""
        c = self.running.get(older.ident)
        if c is not None:
            try:
                c.notify("cancel", {"id": 1})
            except OSError:
                pass

    def close(self) -> None:
        self.ctl.close()


class InfillEditor:
    """An editor talking to llama-server ``/infill`` the way llama.vim does."""

    name = "llama-server /infill"

    def __init__(self, server, max_tokens: int):
        self.server, self.max_tokens = server, max_tokens
        self.conns: dict[int, http.client.HTTPConnection] = {}

    def event(self, step: Step, prev: Step | None) -> None:
        pass  # /infill gets the whole text with each request

    def fire(self, req: Fired, out: Outcome) -> None:
        from .peers import SAMPLING

        line = req.doc.rfind("\n", 0, req.cursor) + 1
        body = {"input_prefix": req.doc[:line], "prompt": req.doc[line:req.cursor],
                "input_suffix": req.doc[req.cursor:], "input_extra": [], "n_predict": self.max_tokens,
                **SAMPLING, "stream": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=600)
        self.conns[threading.get_ident()] = conn
        try:
            conn.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            timings = None
            for raw in resp:
                if not raw.startswith(b"data: "):
                    continue
                msg = json.loads(raw[6:])
                if msg.get("content"):
                    out.pieces.append((time.perf_counter(), msg["content"]))
                    if out.t_first is None:
                        out.t_first = out.pieces[-1][0]
                if msg.get("stop"):
                    timings = msg.get("timings", {})
                    break
            if timings is None:  # the stream ended without its last message: cancelled (connection closed)
                out.cancelled = True
                return
            out.t_done = time.perf_counter()
            out.evaluated = timings.get("prompt_n")
            out.t_first_derived = out.t_done - timings.get("predicted_ms", 0.0) / 1e3
            out.wait_ms = (out.t_done - out.t_send) * 1e3 - timings.get("prompt_ms", 0) - timings.get("predicted_ms", 0)
        except (OSError, http.client.HTTPException, ValueError):
            out.cancelled = True
        finally:
            conn.close()

    def cancel(self, older: threading.Thread) -> None:
        conn = self.conns.pop(older.ident, None)
        if conn is not None and conn.sock is not None:  # llama.vim drops the older job
            try:
                conn.sock.shutdown(2)
            except OSError:
                pass

    def close(self) -> None:
        pass


def spawn_efim(cfg):
    """A daemon for a paced replay (``paced.PacedConfig``; its budget the config's unless ``cfg``
    sets one), and an editor on it: (process, editor)."""
    from . import util as bu

    conf = {"max_tokens": cfg.max_tokens, **({"repo_context": True} if cfg.repo is not None else {})}
    if cfg.max_prompt_ms is not None:  # None: the config's default budget
        conf["max_prompt_ms"] = cfg.max_prompt_ms
    proc, sock = bu.spawn_daemon(cfg.model, None, "--layout", "efim", "--n-ctx", str(cfg.n_ctx),
                                 "--threads", str(cfg.threads), config=conf)
    time.sleep(2.0)  # the daemon measures its prefill speed when idle after start
    return proc, EfimEditor(sock, cfg.max_tokens)
