"""The engine thread: the only thread that touches llama.cpp, running the engine's scheduler.

The scheduler (``engine/scheduler.py``) decides what runs when; this module turns the daemon's
jobs into its tasks and their results into replies. Requests wait in a bounded queue (a full
queue answers "busy"). A newer ``complete`` for a document supersedes an older one, which is
answered "cancelled"; the prompt work it already did stays in its slot.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import CompletionRequest, Engine
from ..engine.scheduler import Scheduler
from ..engine.tasks import RequestTask
from ..errors import Busy, Cancelled, EfimError, InternalError, internal
from .framing import error, notification, reply
from .logs import RequestStats

log = logging.getLogger("efim.daemon")

QUEUE_TIMEOUT = 30.0  # seconds a completion may wait before it is answered "busy"


@dataclass
class Job:
    rid: Any
    key: str  # the document: a newer job with the same key supersedes this one
    request: CompletionRequest
    conn: Any  # has send(bytes)
    stream: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)


class Worker:
    """The engine thread and its scheduler. The scheduler's queues outlive the thread: if the thread
    dies anyway (a bug that escapes every handler, or a BaseException), ``revive()`` starts a new one
    on them."""

    def __init__(self, engine: Engine, queue_size: int = 16):
        self.thread: threading.Thread | None = None
        self.engine = engine
        self.scheduler = Scheduler(engine, queue_size, follow_up=True)
        self.served = 0
        self.errors = 0
        self.stats = RequestStats(engine.default_layout, engine.layout_reason)  # log lines, latencies, hit rates

    # -- the thread ------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self.scheduler.run, name="efim-engine", daemon=True)
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def revive(self) -> None:
        """Start a new engine thread after the last one died: the requests it was running get an
        error, the queued ones are served by the new thread."""
        for task in self.scheduler.orphans():
            self.errors += 1
            job = task.owner
            job.conn.send(error(job.rid, InternalError("internal error: the engine thread failed; restarted")))
        self.start()

    # -- called from connection threads --------------------------------------------
    def submit(self, job: Job) -> None:
        on_text = None
        if job.stream:
            conn, rid = job.conn, job.rid
            on_text = lambda text: conn.send(notification("completion/partial", {"id": rid, "text": text}))
        task = RequestTask(job.key, job.request, lambda out, err: self._done(job, out, err), on_text,
                           cancelled=job.cancelled, max_wait=QUEUE_TIMEOUT, owner=job)
        for old in self.scheduler.submit(task):  # replies go out after the scheduler's lock is released
            old.owner.conn.send(error(old.owner.rid, Cancelled("cancelled: superseded by a newer request")))

    def cancel(self, conn, rid) -> bool:
        task, queued = self.scheduler.cancel(lambda t: t.owner.conn is conn and t.owner.rid == rid)
        if task is None:
            return False
        if queued:
            conn.send(error(rid, Cancelled()))
        return True

    def call(self, fn: Callable[[Engine], Any], timeout: float = 30.0, light: bool = False) -> Any:
        """Run ``fn(engine)`` on the engine thread and return its result (``light``: it only reads;
        Scheduler.call)."""
        return self.scheduler.call(fn, timeout, light)

    def post(self, fn: Callable[[Engine], Any], light: bool = False) -> None:
        """Run ``fn(engine)`` on the engine thread, without waiting (``light``: Scheduler.post)."""
        self.scheduler.post(fn, light)

    def add_idle(self, task: Callable, key: Any = None, path: str | None = None, first: bool = False) -> None:
        """Queue ``task(engine, should_stop)`` for idle time (it may return a generator of steps). A
        task with the same ``key`` still queued is replaced; one interrupted by a request is queued
        again, to go on when the daemon is idle; ``first``: before the others."""
        self.scheduler.add_background(task, key, path, first)

    def idle_pending(self) -> int:
        """Idle tasks queued or running."""
        return self.scheduler.pending_background()

    def stop(self) -> None:
        self.scheduler.stop()

    def queued(self) -> int:
        return self.scheduler.queued()

    # -- the engine thread -----------------------------------------------------------
    def _done(self, job: Job, out, err: BaseException | None) -> None:
        """A request ended: reply and count (the engine queues the file's follow-up work itself)."""
        conn, rid = job.conn, job.rid
        if err is None:
            self.served += 1
            answer = out.to_json()
            conn.send(reply(rid, answer))
            self.stats.record(job.request.path, answer)
            return
        if not isinstance(err, EfimError):
            self.errors += 1
            if isinstance(err, Exception):
                log.error("completion failed", exc_info=err)
        elif err.code not in (Cancelled.code, Busy.code) and err.exit_code != 2:
            self.errors += 1
        conn.send(error(rid, internal(err)))

    def repo_later(self, path: str, first: bool = False) -> None:
        """(Re)compute the repository context of ``path`` while idle (``FollowUp.repo_later``)."""
        self.scheduler.follow.repo_later(path, first)
