"""What the scheduler runs (``scheduler.py``): requests, and background work."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable

from ..request import CompletionRequest
from .background import Alongside

log = logging.getLogger("efim.engine")


@dataclass(eq=False)
class RequestTask:
    """A completion to run. Its ``future`` resolves to the Completion, or raises the error it ended
    with (Cancelled, Busy, ...), on the thread that ended it: the engine thread, or the caller's for
    a queued task it superseded or cancelled (``Scheduler.submit``). ``key`` names its document: a
    newer task with the same key supersedes it. ``on_text`` gets the text shown so far (streaming)."""

    key: Any
    request: CompletionRequest
    on_text: Callable[[str], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)  # of the scheduler's clock (Policy.clock's default)
    max_wait: float = 30.0  # seconds it may wait in the queue before it is answered "busy"
    steps: Any = None  # the running generator
    phase: str = "queued"  # queued | prefill | generate
    ride: Alongside | None = None
    owner: Any = None  # the caller's own record of it (the daemon's job)
    future: Future = field(default_factory=Future)

    def resolve(self, out: Any, err: BaseException | None) -> None:
        """End the task: its future's result ``out``, or its exception ``err`` (not None). The
        future's callbacks (a reply) run here; their failures are logged, never raised."""
        try:
            if err is None:
                self.future.set_result(out)
            else:
                self.future.set_exception(err)
        except InvalidStateError:  # its owner cancelled the future itself: nobody waits for it
            log.debug("a request's future was already done")


@dataclass(eq=False)
class BackgroundTask:
    """``fn(engine, should_stop)``: returns a generator of steps, or None when it did its work at once."""

    key: Any
    fn: Callable
    path: str | None = None  # the file it works for (the latest request's file goes first)
    steps: Any = None
    # Work for the request that is due (an answer begun at its keystroke): it never waits for that
    # request (Pace.hold_s), and once stopped it is not begun again (the request took it over).
    for_request: bool = False


class BackgroundQueue:
    """The background tasks waiting for idle time, and the one started (``current``), under the
    scheduler's lock. A task with the same key as a queued one replaces it (the newer one knows
    better, e.g. the cursor moved again); a started task that is stopped goes back first."""

    def __init__(self, lock):
        self.lock = lock
        self.waiting: deque[BackgroundTask] = deque()
        self.current: BackgroundTask | None = None

    def add(self, task: BackgroundTask, first: bool = False) -> bool:
        """(Holding the lock.) Whether it preempts the started task (``preempted``)."""
        if task.key is not None:
            for old in [w for w in self.waiting if w.key == task.key]:
                self.waiting.remove(old)
        if first:
            self.waiting.appendleft(task)
        else:
            self.waiting.append(task)
        return task.for_request and self.current is not None and not self.current.for_request

    def __len__(self) -> int:
        """Tasks queued or started."""
        return len(self.waiting) + (self.current is not None)

    def preempted(self) -> bool:
        """Whether work for a due request waits behind a started task of another kind (which then stops,
        and goes on after it)."""
        with self.lock:
            return any(t.for_request for t in self.waiting) and self.current is not None \
                and not self.current.for_request

    def start(self, path: str | None) -> BackgroundTask | None:
        """(Holding the lock.) The started task, else the next one: work for a due request first, then
        ``path``'s (the latest request's file: it is nearest the cursor); None when there is none."""
        if self.current is None and self.waiting:
            first = next((t for t in self.waiting if t.for_request), None) or next(
                (t for t in self.waiting if t.path is not None and t.path == path), self.waiting[0])
            self.waiting.remove(first)
            self.current = first
        return self.current

    def requeue(self) -> None:
        """The started task stops and goes back first (its work so far stays in its slot), unless a
        newer task with its key took its place."""
        with self.lock:
            task, self.current = self.current, None
            if task is None:
                return
            task.steps = None
            if not task.for_request and (task.key is None or all(w.key != task.key for w in self.waiting)):
                self.waiting.appendleft(task)

    def started(self) -> dict | None:
        """(Any thread.) The started task, for status: its key, its file, and its jobs in progress
        (``steps.Steps.jobs``, outermost first; none between two of its runs); None when idle work rests."""
        with self.lock:
            task = self.current
            steps = task.steps if task is not None else None
        if task is None:
            return None
        key = task.key[0] if isinstance(task.key, tuple) else task.key
        return {"task": "idle" if key is None else str(key), "path": task.path,
                "jobs": steps.jobs if steps is not None else []}

    def drop(self) -> None:
        """The started task is done (or failed)."""
        with self.lock:
            self.current = None
