"""The engine thread: the only thread that touches llama.cpp, running the engine's scheduler.

The scheduler (``engine/scheduler.py``) decides what runs when, and the engine what work follows
(``engine/followup.py``); this module turns the daemon's jobs into its tasks, and replies from each
task's future when it resolves. Requests wait in a bounded queue (a full queue answers "busy"). A
newer ``complete`` for a document supersedes an older one, which is answered "cancelled"; the
prompt work it already did stays in its slot.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from concurrent.futures import Future
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
        self.follow = self.scheduler.follow  # the engine's background work on the editor's notes
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
        self.scheduler.orphans(InternalError("internal error: the engine thread failed; restarted"))  # (_reply)
        self.start()

    # -- called from connection threads --------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job``; its reply goes out when its future resolves (``_reply``): on the engine
        thread when it ends, before the engine queues its follow-up work; in this thread for a
        queued job that a newer one superseded (after the scheduler's lock is released). Raises
        Busy when the queue is full."""
        on_text = None
        if job.stream:
            conn, rid = job.conn, job.rid
            on_text = lambda text: conn.send(notification("completion/partial", {"id": rid, "text": text}))
        task = RequestTask(job.key, job.request, on_text, cancelled=job.cancelled, max_wait=QUEUE_TIMEOUT, owner=job)
        task.future.add_done_callback(lambda fut: self._reply(job, fut))  # before it can end
        self.scheduler.submit(task)

    def cancel(self, conn, rid) -> bool:
        """Cancel a job: a queued one is answered "cancelled" here, a running one as it ends."""
        return self.scheduler.cancel(lambda t: t.owner.conn is conn and t.owner.rid == rid) is not None

    def call(self, fn: Callable[[Engine], Any], timeout: float = 30.0, light: bool = False) -> Any:
        """Run ``fn(engine)`` on the engine thread and return its result (``light``: it only reads;
        Scheduler.call)."""
        return self.scheduler.call(fn, timeout, light)

    def post(self, fn: Callable[[Engine], Any], light: bool = False) -> None:
        """Run ``fn(engine)`` on the engine thread, without waiting (``light``: Scheduler.post)."""
        self.scheduler.post(fn, light)

    def idle_pending(self) -> int:
        """Idle tasks queued or running."""
        return self.scheduler.pending_background()

    def stop(self) -> None:
        self.scheduler.stop()

    def queued(self) -> int:
        return self.scheduler.queued()

    # -- a job's future resolved (the engine thread, else the thread that cancelled it) ------------
    def _reply(self, job: Job, fut: Future) -> None:
        """A request ended: reply and count (the engine queues the file's follow-up work itself)."""
        try:
            self._answer(job, fut)
        except Exception:  # noqa: BLE001 - a reply that cannot be sent never stops the engine
            log.exception("answering a request failed")

    def _answer(self, job: Job, fut: Future) -> None:
        conn, rid = job.conn, job.rid
        err = fut.exception()
        if err is None:
            self.served += 1
            answer = fut.result().to_json()
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
