"""The daemon's methods: complete, didOpen, didChange, didClose, cursor, definitions, cancel, status,
accepted, shutdown.

Each handler validates its params (one-line ``InvalidParams`` errors), then
either answers at once or hands a job to the engine thread (``worker.py``). What background work
an editor's note leads to (prefill, the repository context) is the engine's decision
(``engine/followup.py``): the handlers only translate the protocol into its calls.
"""

from __future__ import annotations

import os
import threading
import time

from .. import __version__
from ..engine import CompletionRequest, Engine
from ..engine.reduction import help_text
from ..errors import InvalidParams, InvalidRequest
from .dispatch import DEFERRED
from . import test_hooks
from .documents import Documents, check_size, name_param, path_param, position
from .framing import Connection, Message, param, valid_id
from .worker import Job, Worker


class Handlers:
    """Method table of one daemon; ``server`` gives the socket, watcher and stop()."""

    def __init__(self, server, engine: Engine, worker: Worker):
        self.server, self.engine, self.worker = server, engine, worker
        self.follow = worker.follow  # the engine's background work on the editor's notes
        self.documents = Documents(engine.files)
        # The documents each connection opened and has not closed: a connection that ends closes them
        # (an editor that quits or forgets a buffer; else they count against the open-document limit).
        self.opened: dict[Connection, set[str]] = {}
        self.opened_lock = threading.Lock()
        # what editors reported taking of the completions (efim lsp's accept notifications)
        self.acceptance = {"completions": 0, "partial": 0, "offered_chars": 0, "accepted_chars": 0}
        self.definitions_seen = {"messages": 0, "locations": 0}  # editors' "go to definition" results

    def table(self) -> dict:
        return {"complete": self.complete, "didOpen": self.did_open, "didChange": self.did_change,
                "didClose": self.did_close, "cursor": self.cursor, "cancel": self.cancel, "status": self.status,
                "shutdown": self.shutdown, "accepted": self.accepted, "definitions": self.definitions,
                "clearCache": self.clear_cache, **test_hooks.methods(self)}

    def complete(self, conn: Connection, msg: Message):
        p = msg.params
        path = path_param(p)
        if "text" in p:
            text = param(p, "text", str)
            check_size(text)
        else:  # the editor's version, when given: never complete a text the editor no longer has
            text = self.documents.text(path, param(p, "version", int, None, lo=0, hi=1 << 53))
        if "offset" in p:
            cursor = param(p, "offset", int, lo=0, hi=len(text))
        else:
            cursor = position(p, "position", text)
        req = CompletionRequest.from_params(p, text, cursor, path)
        if msg.is_notification:
            raise InvalidRequest("invalid request: complete needs an id")
        self.engine.pace.requested()
        self.worker.submit(Job(msg.id, path, req, conn, stream=param(p, "stream", bool, False)))
        return DEFERRED

    def did_open(self, conn, msg):
        root = name_param(msg.params, "root", None)  # checked before the document is opened
        f = self.documents.open(msg.params)
        with self.opened_lock:
            self.opened.setdefault(conn, set()).add(f.path)
        if self.server.watcher and root:
            self.server.watcher.watch(root)
        self.follow.opened(f.path)
        return {"path": f.path, "version": f.version}

    def did_change(self, conn, msg):
        f = self.documents.change(msg.params)
        self.engine.pace.typed()  # idle work may take a bigger batch before the next request can come
        self.follow.typed(f.path, f.version)
        return {"path": f.path, "version": f.version}

    def did_close(self, conn, msg):
        path = path_param(msg.params)
        with self.opened_lock:
            for paths in self.opened.values():  # closed for every connection, as before
                paths.discard(path)
        self._close(path)
        return None

    def _close(self, path: str) -> None:
        self.documents.close({"path": path})
        self.follow.closed(path)

    def connection_closed(self, conn) -> None:
        """``conn`` ended: close the documents it opened that no other connection has open."""
        with self.opened_lock:
            mine = self.opened.pop(conn, set())
            others = set().union(*self.opened.values())
        for path in sorted(mine - others):
            self._close(path)

    def cursor(self, conn, msg):
        """The cursor settled in an open document: prefill the plan anchored there, when idle."""
        p = msg.params
        path = path_param(p)
        text = self.documents.text(path)
        cursor = param(p, "offset", int, lo=0, hi=len(text)) if "offset" in p else position(p, "position", text)
        self.follow.cursor(path, cursor)
        return {"path": path, "offset": cursor}

    def definitions(self, conn, msg):
        """Where the editor's language server resolved the names an open document imports: they join
        its repository context (T1), rebuilt while idle."""
        p = msg.params
        path = path_param(p)
        self.documents.text(path)  # an open document
        locs = param(p, "definitions", list)
        if len(locs) > 256:
            raise InvalidParams("invalid params: at most 256 definitions")
        pairs = []
        for loc in locs:
            if not isinstance(loc, dict):
                raise InvalidParams("invalid params: each definition must be an object")
            pairs.append((name_param(loc, "path"), param(loc, "line", int, lo=0, hi=1 << 24)))
        self.definitions_seen["messages"] += 1
        self.definitions_seen["locations"] += len(pairs)
        kept = self.follow.definitions(path, pairs)
        return {"path": path, "definitions": kept}

    def cancel(self, conn, msg):
        rid = msg.params.get("id")
        if not valid_id(rid):
            raise InvalidParams("invalid params: 'id' must be a request id")
        return {"cancelled": self.worker.cancel(conn, rid)}

    def status(self, conn=None, msg=None) -> dict:
        self.engine.status_report.measure_cores()  # here, not on the engine's thread: it may wait a quarter second
        info = self.worker.call(lambda e: e.status(), light=True)
        s = self.server
        info.update({"version": __version__, "socket": str(s.sock_path), "pid": os.getpid(),
                     "uptime_s": round(time.time() - s.started, 1),
                     "queued": self.worker.queued(), "idle_tasks": self.worker.idle_pending(),
                     "idle_task": self.worker.scheduler.background.started(),
                     "served": self.worker.served, "errors": self.worker.errors,
                     "documents": self.engine.files.n_open(), "watching": s.watcher.roots() if s.watcher else [],
                     "accepted": dict(self.acceptance), "definitions": dict(self.definitions_seen),
                     "editor_debounce_ms": round(self.engine.pace.debounce_s * 1e3)})
        spent = dict(self.worker.scheduler.spent)  # where the engine's time went, by kind of work
        req = self.worker.stats.summary()
        info.update(requests=req, python_threads=threading.active_count(),
                    engine_time_s={k: round(v, 2) for k, v in sorted(spent.items())})
        info["context_help"] = help_text(info, (req["context"] or {}).get("last_minute") or {"requests": 0})
        return info

    def accepted(self, conn, msg):
        """An editor took ``accepted`` code points of completion ``text`` (all: a full accept)."""
        p = msg.params
        path = path_param(p)
        param(p, "id", str, "")
        text = param(p, "text", str)
        check_size(text)
        n = param(p, "accepted", int, lo=0, hi=len(text))
        if n:  # the next keystroke takes what was accepted: answered from the continuation computed ahead
            self.follow.accepted(path)
        a = self.acceptance
        a["completions" if n == len(text) else "partial"] += 1
        a["offered_chars"] += len(text)
        a["accepted_chars"] += n
        return dict(a)

    def clear_cache(self, conn, msg):
        """`efim cache clear` while the daemon runs: empty the live slots and the store (RAM tier
        too), on the engine thread, so that nothing is written back afterwards."""
        def clear(engine: Engine) -> dict:
            engine.clear_slots()
            n = len(engine.store.index.rows()) if engine.store else 0
            if engine.store:
                engine.store.clear()
            return {"deleted": n, "slots_cleared": len(engine.slots.slots)}

        return self.worker.call(clear)

    def shutdown(self, conn, msg):
        threading.Timer(0.05, self.server.stop).start()
        return {"stopping": True}

    # -- the watcher -----------------------------------------------------------------------
    def file_changed(self, path: str) -> None:
        """A file changed on disk: the engine forgets its plan and prefills it in idle time."""
        self.follow.changed_on_disk(path)
