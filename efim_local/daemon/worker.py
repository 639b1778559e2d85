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

from ..engine import CompletionRequest, Engine
from ..errors import Busy, Cancelled, EfimError, InternalError, internal
from .framing import error, notification, reply
from .logs import RequestStats

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
IDLE_GRACE = 0.05  # seconds after a reply before idle work starts: a request right behind it never waits


class Worker:
    """The engine thread and its queues. The queues outlive the thread: if the thread dies anyway
    (a bug that escapes every handler, or a BaseException), ``revive()`` starts a new one on them."""

    def __init__(self, engine: Engine, queue_size: int = 16):
        self.thread: threading.Thread | None = None
        self.engine = engine
        self.queue_size = queue_size
        self.cond = threading.Condition()
        self.jobs: deque[Job] = deque()
        self.calls: deque[tuple[Callable, Future]] = deque()
        self.idle_work: deque[tuple[Any, Callable]] = deque()  # (key, task)
        self.idle_running = False
        self.running: Job | None = None
        self.stopping = False
        self.served = 0
        self.errors = 0
        self.stats = RequestStats(engine.default_layout, engine.layout_reason)  # log lines, latencies, hit rates

    # -- the thread ------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="efim-engine", daemon=True)
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def revive(self) -> None:
        """Start a new engine thread after the last one died: the request it was running gets an
        error, the queued ones are served by the new thread."""
        with self.cond:
            job, self.running = self.running, None
            self.idle_running = False
        if job is not None:
            self.errors += 1
            job.conn.send(error(job.rid, InternalError("internal error: the engine thread failed; restarted")))
        self.start()

    # -- called from connection threads --------------------------------------------
    def submit(self, job: Job) -> None:
        with self.cond:
            superseded = [j for j in self.jobs if j.key == job.key]
            for old in superseded:
                self.jobs.remove(old)
            if self.running is not None and self.running.key == job.key:
                self.running.cancelled.set()
            full = len(self.jobs) >= self.queue_size
            if not full:
                self.jobs.append(job)
                self.cond.notify()
        for old in superseded:  # replies go out after the lock is released
            old.conn.send(error(old.rid, Cancelled("cancelled: superseded by a newer request")))
        if full:
            raise Busy(f"busy: {self.queue_size} requests queued, retry later")

    def cancel(self, conn, rid) -> bool:
        with self.cond:
            queued = next((j for j in self.jobs if j.conn is conn and j.rid == rid), None)
            if queued is not None:
                self.jobs.remove(queued)
            elif self.running is not None and self.running.conn is conn and self.running.rid == rid:
                self.running.cancelled.set()
                return True
            else:
                return False
        conn.send(error(rid, Cancelled()))
        return True

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

    def add_idle(self, task: Callable[[Engine, Callable[[], bool]], Any], key: Any = None) -> None:
        """Queue ``task(engine, should_stop)`` for idle time. A task with the same ``key`` still
        queued is replaced (the newer one knows better, e.g. the cursor moved again). A task
        interrupted by a request is queued again, to go on when the daemon is idle."""
        with self.cond:
            if key is not None:
                for old in [w for w in self.idle_work if w[0] == key]:
                    self.idle_work.remove(old)
            self.idle_work.append((key, task))
            self.cond.notify()

    def idle_pending(self) -> int:
        """Idle tasks queued or running."""
        with self.cond:
            return len(self.idle_work) + self.idle_running

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
        idle_at = 0.0  # idle work waits IDLE_GRACE after the last reply
        while True:
            save = False
            with self.cond:
                while not (self.jobs or self.calls or self.stopping):
                    now = time.monotonic()
                    if self.idle_work and now >= idle_at:
                        break
                    if save_at is not None and now >= save_at:
                        save = True
                        break
                    waits = [t - now for t in (save_at, idle_at if self.idle_work else None) if t is not None]
                    self.cond.wait(min(waits) if waits else None)
                job = fn = idle = None
                if self.calls:
                    fn, fut = self.calls.popleft()
                elif self.jobs:
                    job = self.running = self.jobs.popleft()
                elif self.stopping:
                    return
                elif self.idle_work and not save:
                    idle = self.idle_work.popleft()
                    self.idle_running = True
            if fn is not None:
                self._call(fn, fut)
            elif job is not None:
                self._quietly(lambda: self._complete(job))  # noqa: B023 - never lets the thread die
                with self.cond:
                    self.running = None
                save_at = time.monotonic() + SAVE_DELAY
                idle_at = time.monotonic() + IDLE_GRACE
            elif idle is not None:
                key, task = idle
                if not self._quietly(lambda: task(self.engine, self._busy)):  # noqa: B023 - called at once
                    with self.cond:  # interrupted: go on later, unless a newer task took its place
                        if key is None or all(w[0] != key for w in self.idle_work):
                            self.idle_work.appendleft(idle)
                with self.cond:
                    self.idle_running = False
            else:
                save_at = None
                self._quietly(self.engine.flush)  # a pause in typing: keep the states

    def _busy(self) -> bool:
        return bool(self.jobs) or bool(self.calls) or self.stopping

    def _call(self, fn, fut: Future) -> None:
        try:
            fut.set_result(fn(self.engine))
        except Exception as e:  # handed to the caller
            fut.set_exception(e)
        except BaseException as e:  # SystemExit and the like end the thread (the watchdog restarts it)
            fut.set_exception(e)
            raise

    def _quietly(self, fn) -> bool:
        """Run background work; False if a request interrupted it."""
        try:
            fn()
        except Cancelled:
            return False
        except Exception:  # noqa: BLE001 - idle work never takes the engine thread down
            log.exception("background work failed")
        return True

    def _complete(self, job: Job) -> None:
        conn, rid = job.conn, job.rid
        on_text = None
        if job.stream:
            on_text = lambda text: conn.send(notification("completion/partial", {"id": rid, "text": text}))
        try:
            if job.cancelled.is_set():
                raise Cancelled()
            if time.monotonic() - job.queued_at > QUEUE_TIMEOUT:
                raise Busy(f"busy: waited more than {QUEUE_TIMEOUT:.0f} s in the queue")
            out = self.engine.complete(job.request, on_text=on_text, should_stop=job.cancelled.is_set,
                                       yield_to=self._busy)
            self.served += 1
            answer = out.to_json()
            conn.send(reply(rid, answer))
            self.stats.record(job.request.path, answer)
        except Exception as e:  # noqa: BLE001 - never a traceback to the client
            if not isinstance(e, EfimError):
                self.errors += 1
                log.exception("completion failed")
            elif e.code not in (Cancelled.code, Busy.code) and e.exit_code != 2:
                self.errors += 1
            conn.send(error(rid, internal(e)))
        finally:
            self._grow_later(job.request.path)

    def _grow_later(self, path: str | None) -> None:
        """If the budget cut the context of ``path``'s plan, grow it back while idle. Answered or not:
        most requests are cancelled by the next keystroke, and their plan is the next one's."""
        if self.engine.reduced(path):
            self.add_idle(lambda engine, should_stop: engine.grow(path, should_stop), key=("grow", path))
