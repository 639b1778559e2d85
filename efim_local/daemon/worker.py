"""The engine thread: the only thread that touches llama.cpp.

Requests wait in a bounded queue (a full queue answers "busy"). A newer
``complete`` for a document supersedes an older one, which is answered
"cancelled"; the prompt work it already did stays in its slot. When the
queue is empty the thread saves dirty slots (after the replies went out) and
runs idle work, such as prefilling recently edited files, which yields as
soon as a real request arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import Cancelled, CompletionRequest, Engine
from ..planner import PlanError
from . import protocol as P

log = logging.getLogger("efim.daemon")


@dataclass
class Job:
    rid: Any
    key: str  # the document: a newer job with the same key supersedes this one
    request: CompletionRequest
    conn: Any  # has send(bytes)
    stream: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.monotonic)


QUEUE_TIMEOUT = 30.0  # seconds a completion may wait before it is answered "busy"
SAVE_DELAY = 0.5  # seconds of quiet before dirty slots are saved: a burst of keystrokes is saved once


class Worker(threading.Thread):
    def __init__(self, engine: Engine, queue_size: int = 16):
        super().__init__(name="efim-engine", daemon=True)
        self.engine = engine
        self.queue_size = queue_size
        self.cond = threading.Condition()
        self.jobs: deque[Job] = deque()
        self.calls: deque[tuple[Callable, Future]] = deque()
        self.idle_work: deque[Callable] = deque()
        self.running: Job | None = None
        self.stopping = False
        self.served = 0
        self.errors = 0
        self.cursors: dict[str, int] = {}  # last cursor offset per document, for idle prefill

    # -- called from connection threads --------------------------------------------
    def submit(self, job: Job) -> None:
        with self.cond:
            for old in [j for j in self.jobs if j.key == job.key]:
                self.jobs.remove(old)
                old.conn.send(P.error(old.rid, P.RpcError(P.CANCELLED, "cancelled: superseded by a newer request")))
            if self.running is not None and self.running.key == job.key:
                self.running.cancelled.set()
            if len(self.jobs) >= self.queue_size:
                raise P.RpcError(P.BUSY, f"busy: {len(self.jobs)} requests queued, retry later")
            self.jobs.append(job)
            self.cond.notify()

    def cancel(self, conn, rid) -> bool:
        with self.cond:
            for j in self.jobs:
                if j.conn is conn and j.rid == rid:
                    self.jobs.remove(j)
                    conn.send(P.error(rid, P.RpcError(P.CANCELLED, "cancelled")))
                    return True
            if self.running is not None and self.running.conn is conn and self.running.rid == rid:
                self.running.cancelled.set()
                return True
        return False

    def call(self, fn: Callable[[Engine], Any], timeout: float = 30.0) -> Any:
        """Run ``fn(engine)`` on the engine thread and return its result."""
        fut: Future = Future()
        with self.cond:
            self.calls.append((fn, fut))
            self.cond.notify()
        return fut.result(timeout)

    def post(self, fn: Callable[[Engine], Any]) -> None:
        """Run ``fn(engine)`` on the engine thread, without waiting."""
        with self.cond:
            self.calls.append((fn, Future()))
            self.cond.notify()

    def add_idle(self, task: Callable[[Engine, Callable[[], bool]], Any]) -> None:
        """Queue ``task(engine, should_stop)`` for idle time."""
        with self.cond:
            self.idle_work.append(task)
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def queued(self) -> int:
        with self.cond:
            return len(self.jobs)

    # -- the engine thread ---------------------------------------------------------------
    def run(self) -> None:
        save_at = None  # when to save dirty slots: after SAVE_DELAY of quiet, not after every reply
        while True:
            save = False
            with self.cond:
                while not (self.jobs or self.calls or self.idle_work or self.stopping):
                    if save_at is None:
                        self.cond.wait()
                    elif time.monotonic() >= save_at:
                        save = True
                        break
                    else:
                        self.cond.wait(save_at - time.monotonic())
                job = fn = idle = None
                if self.calls:
                    fn, fut = self.calls.popleft()
                elif self.jobs:
                    job = self.running = self.jobs.popleft()
                elif self.stopping:
                    return
                elif self.idle_work and not save:
                    idle = self.idle_work.popleft()
            if fn is not None:
                self._call(fn, fut)
            elif job is not None:
                self._complete(job)
                with self.cond:
                    self.running = None
                save_at = time.monotonic() + SAVE_DELAY
            elif idle is not None:
                self._quietly(lambda: idle(self.engine, self._busy))
            else:
                save_at = None
                self._quietly(self.engine.flush)  # a pause in typing: keep the states

    def _busy(self) -> bool:
        return bool(self.jobs) or bool(self.calls) or self.stopping

    def _call(self, fn, fut: Future) -> None:
        try:
            fut.set_result(fn(self.engine))
        except BaseException as e:  # handed to the caller
            fut.set_exception(e)

    def _quietly(self, fn) -> None:
        try:
            fn()
        except Cancelled:
            pass
        except Exception:
            log.exception("background work failed")

    def _complete(self, job: Job) -> None:
        conn, rid = job.conn, job.rid
        on_text = None
        if job.stream:
            on_text = lambda text: conn.send(P.notification("completion/partial", {"id": rid, "text": text}))
        try:
            if job.cancelled.is_set():
                raise Cancelled()
            if time.monotonic() - job.queued_at > QUEUE_TIMEOUT:
                conn.send(P.error(rid, P.RpcError(P.BUSY, f"busy: waited more than {QUEUE_TIMEOUT:.0f} s in the queue")))
                return
            out = self.engine.complete(job.request, on_text=on_text, should_stop=job.cancelled.is_set)
            self.cursors[job.key] = job.request.cursor
            self.served += 1
            conn.send(P.reply(rid, out.to_json()))
        except Cancelled:
            conn.send(P.error(rid, P.RpcError(P.CANCELLED, "cancelled")))
        except PlanError as e:
            conn.send(P.error(rid, P.RpcError(P.INVALID_PARAMS, f"invalid params: {e}")))
        except Exception as e:  # never a traceback to the client
            self.errors += 1
            log.exception("completion failed")
            conn.send(P.error(rid, P.RpcError(P.MODEL_ERROR, f"model error: {e.__class__.__name__}")))
