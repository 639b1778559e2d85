"""The scheduler: one owner of the engine's time.

Work is small steps (``run.py``, ``background.py``): a request's prefill batch, one generated token,
a growth chunk, an idle prefill chunk, calibration, a save. Like llama.cpp server's slot loop, one
thread ticks (``tick``): each tick takes one step, picked by priority (``_pick``), and each slot says
what runs in it (``slots.Slot.job``, ``phase``):

1. calls (status, test hooks: short, synchronous);
2. a waiting request: it starts between two steps of any other when a slot has no request running in
   it (else it waits, "busy" after ``max_wait``); one it superseded ends first (its slot and trail are the new one's);
3. requests already running: prefill before generation, generation in turns, one token each; growth
   rides along a reduced request's generation (``background.Alongside``) when no request waits;
4. after a short grace, background work: an answer begun at a keystroke first, then the file of the
   latest request (nearest the cursor); a task is closed when a request or a call comes, and queued again;
5. after a quiet spell, saving dirty slots.

A request's future (``submit``) resolves when it ends (its callbacks, the daemon's reply, on the
engine thread); then, with ``follow_up``, the engine queues its follow-up work (``followup.py``).

The waits (the grace before idle work, the quiet before a save, holding idle work for a due request)
are the engine's policy (``policy.py``), on its clock (tests/unit/test_policy.py: a fake one, ticks).

Requests never wait for background work beyond one step (or one tokenizer poll): its prompt batch
stops between two graph nodes when a request or a call comes (``Engine.interrupt``; the task goes on later).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from ..errors import Busy, Cancelled, Interrupted
from .background import Alongside
from .decode import PREFILL, SHOWN
from .followup import FollowUp
from .run import RunOptions
from .steps import Steps
from .tasks import BackgroundQueue, BackgroundTask, RequestTask

log = logging.getLogger("efim.engine")


class Scheduler:
    """The engine's queues and the loop that runs them (see the module's docstring)."""

    def __init__(self, engine, queue_size: int = 16, follow_up: bool = False):
        """``follow_up``: each request queues its file's follow-up work (``followup.py``: the answer's
        continuation, growth, the repository context), as the daemon's engine does."""
        self.engine = engine
        self.policy = engine.policy  # its waits (save_delay, idle_grace, hold_share) and its clock
        self.clock = self.policy.clock  # (a RequestTask's queued_at is of this clock)
        self.queue_size = queue_size
        self.cond = threading.Condition()
        self.waiting: deque[RequestTask] = deque()
        self.running: list[RequestTask] = []  # started, in the order they take turns
        self.calls: deque[tuple[Callable, Future, bool]] = deque()  # (fn, its future, light)
        self.background = BackgroundQueue(self.cond)
        self.stopping = False
        self.last_path: str | None = None
        self.save_at: float | None = None
        self.idle_at = 0.0
        self.held_at: float | None = None  # since when idle work waits for a request that is due
        self.spent: dict[str, float] = {}  # engine seconds by kind of work (status: where the time goes)
        self.follow = FollowUp(self) if follow_up else None

    def _spend(self, kind: str, since: float) -> None:
        self.spent[kind] = self.spent.get(kind, 0.0) + self.clock() - since

    # -- called from any thread ------------------------------------------------------------
    def submit(self, task: RequestTask) -> Future:
        """Queue a request; its future (``task.future``: the Completion, or the error it ended with).
        Raises Busy when the queue is full. A queued task with the same key is superseded: its future
        raises Cancelled here, in the caller's thread; a running one ends "cancelled" on the engine
        thread. (Callbacks added before run on the engine thread, before the follow-up work.)"""
        with self.cond:
            superseded = [t for t in self.waiting if t.key == task.key]
            for old in superseded:
                self.waiting.remove(old)
            for t in self.running:
                if t.key == task.key:
                    t.cancelled.set()
            full = len(self.waiting) >= self.queue_size
            if not full:
                self.waiting.append(task)
                self._wake()
        for old in superseded:
            old.resolve(None, Cancelled("cancelled: superseded by a newer request"))
        if full:
            raise Busy(f"busy: {self.queue_size} requests queued, retry later")
        return task.future

    def cancel(self, match: Callable[[RequestTask], bool]) -> RequestTask | None:
        """Cancel the first task ``match`` accepts (None: none): a queued one is taken from the queue
        and its future raises Cancelled here, in the caller's thread; a running one ends "cancelled"
        on the engine thread."""
        with self.cond:
            queued = next((t for t in self.waiting if match(t)), None)
            if queued is not None:
                self.waiting.remove(queued)
            running = None if queued is not None else next((t for t in self.running if match(t)), None)
            if running is not None:
                running.cancelled.set()
        if queued is not None:
            queued.resolve(None, Cancelled())
        return queued or running

    def call(self, fn: Callable, timeout: float = 30.0, light: bool = False) -> Any:
        """Run ``fn(engine)`` on the engine thread and return its result (``light``: as ``post``'s; a status
        bar that polled every half second stopped the open file's warm each time, never past its first batch)."""
        return self.post(fn, light).result(timeout)

    def post(self, fn: Callable, light: bool = False) -> Future:
        """Run ``fn(engine)`` on the engine thread, without waiting; its future. A ``light`` one (it
        only reads, or notes the engine thread's own state: a cursor) runs between two steps, neither
        stopping a background batch nor closing its task."""
        fut: Future = Future()
        with self.cond:
            self.calls.append((fn, fut, light))
            if light:
                self.cond.notify()
            else:
                self._wake()
        return fut

    def add_background(self, fn: Callable, key: Any = None, path: str | None = None, first: bool = False,
                       for_request: bool = False) -> None:
        """Queue ``fn(engine, should_stop)`` for idle time. A task with the same ``key`` still queued
        is replaced (the newer one knows better: the cursor moved again); ``first`` queues it before the
        others (a shown answer's continuation: the user may take it); ``for_request``: ``BackgroundTask``'s."""
        with self.cond:
            if self.background.add(BackgroundTask(key, fn, path, for_request=for_request), first):
                self.engine.interrupt()  # the started task's batch stops: this one goes first
            self.cond.notify()

    def pending_background(self) -> int:
        with self.cond:  # background tasks queued or started
            return len(self.background)

    def queued(self) -> int:
        with self.cond:
            return len(self.waiting)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self._wake()

    def _wake(self) -> None:
        """(Holding the lock.) Foreground work came: the engine thread wakes, and a background
        prompt batch in progress stops between two graph nodes instead of at its end."""
        self.cond.notify()
        self.engine.interrupt()

    def waits(self) -> bool:
        """Whether a request or a call waits (background work stops for it)."""
        return bool(self.waiting) or any(not light for _, _, light in self.calls) or self.stopping

    def orphans(self, err: BaseException) -> list[RequestTask]:
        """The started requests, taken away, their futures raising ``err`` (the engine thread died;
        its caller starts another on the same queues)."""
        with self.cond:
            tasks, self.running = self.running, []
            self.background.current = None
        for t in tasks:
            try:
                for job in (t.ride, t.steps):  # (its slot is no longer a request's)
                    if job is not None:
                        job.close()
            except Exception:  # noqa: BLE001 - the thread that ran it died: best effort
                pass
        for slot in self.engine.slots.slots:
            slot.end(slot.owner)
        for t in tasks:
            t.resolve(None, err)
        return tasks

    # -- the engine thread -----------------------------------------------------------------
    def run(self) -> None:
        """The loop: one tick at a time, until stop()."""
        while self.tick():
            pass

    def tick(self) -> bool:
        """One step of the work ``_pick`` chooses (waiting for some first); False once stopped."""
        with self.cond:
            save = self._wait()
            expired = self._expired()
            kind, item = self._pick(save)
            if kind == "stop":
                self._close_background()
                return False
        for task in expired:
            self._end(task, None, Busy(f"busy: waited more than {task.max_wait:.0f} s for a slot"))
        t = self.clock()
        if self.held_at is not None:  # idle work waited for a request that was due (pace.py)
            self._spend("held", self.held_at)
            self.held_at = None
        if kind != "background" and not (kind == "call" and item[2]):
            t = self.engine.mark_active()  # foreground work (idle chunks stay short right after: background.py)
            self._close_background()  # a request or a call comes first: background work goes on later
            for task in self.running:  # and growth riding along another request than the one stepped
                if task is not item and task.ride is not None:
                    task.ride.close()
            self._spend("background", t)
            t = self.clock()
        if kind == "call":
            self._call(*item[:2])
            self._spend("call", t)
        elif kind in ("start", "step"):
            self._step(item)  # (counts its own time)
        elif kind == "save":
            self.save_at = None
            try:  # a pause in typing: keep the states
                self.engine.flush()
            except Exception:  # noqa: BLE001 - saving never takes the engine thread down
                log.exception("saving failed")
            self._spend("save", t)
        else:
            self._background_step()
        return True

    def _pick(self, save: bool) -> tuple[str, Any]:
        """(Holding the lock, some work there.) What the next tick does, by the module docstring's order
        (a superseded request's last step before the start of the one that superseded it); ``save``: its time."""
        if self.calls:
            return "call", self.calls.popleft()
        if self.waiting and (doomed := next((t for t in self.running if t.cancelled.is_set()), None)):
            return "step", doomed
        if self.waiting and not self._full():  # the first whose file a free slot holds (a keystroke that
            # superseded the request running there takes its slot back), else the first in
            free = {s.path for s in self.engine.slots.free() if s.path is not None}
            task = next((t for t in self.waiting if t.request.path in free), self.waiting[0])
            self.waiting.remove(task)
            self.running.insert(0, task)
            return "start", task
        if self.running:
            return "step", self.running[0]
        if self.stopping:
            return "stop", None
        return ("save" if save else "background"), None

    def _expired(self) -> list[RequestTask]:
        """The waiting requests past their ``max_wait``, taken from the queue, while every slot is taken
        (else the next to start is answered "busy" as it starts)."""
        if not (self.waiting and self._full()):
            return []
        now = self.clock()
        late = [t for t in self.waiting if now - t.queued_at > t.max_wait]
        for t in late:
            self.waiting.remove(t)
        return late

    def _full(self) -> bool:
        """Whether every slot has a request running in it (a remote-only engine has none: no limit)."""
        n = len(self.engine.slots.slots)
        return 0 < n <= len(self.running)

    def _wait(self) -> bool:
        """Wait (holding the lock) until there is work; True when it is time to save."""
        while not (self.calls or self.waiting or self.running or self.stopping):
            save, wait = self._idle_due(self.clock())
            if save is not None:
                return save
            self.cond.wait(wait)
        return False

    def _idle_due(self, now: float) -> tuple[bool | None, float | None]:
        """(Holding the lock, no foreground work.) What idle time is for at ``now``: (False: background
        work, True: a save, None: nothing yet), and while nothing is, how long to wait (None: until woken)."""
        ready = len(self.background) > 0
        if ready and now >= self.idle_at:
            return False, None
        if self.save_at is not None and now >= self.save_at:
            return True, None
        waits = [t - now for t in (self.save_at, self.idle_at if ready else None) if t is not None]
        return None, min(waits) if waits else None

    def _step(self, task: RequestTask) -> None:
        """One step of a request: start it, or its next prefill batch or token."""
        t = self.engine.mark_active()  # idle chunks stay short right after (background.py)
        kind = PREFILL
        try:
            if task.steps is None:
                if task.cancelled.is_set():
                    raise Cancelled()
                if self.clock() - task.queued_at > task.max_wait:
                    raise Busy(f"busy: waited more than {task.max_wait:.0f} s in the queue")
                self.last_path = task.request.path
                t0 = self.clock()
                task.ride = Alongside(self.engine, task.request.path, t0, task.cancelled.is_set, self.waits)
                task.steps = Steps(self.engine.runner.complete_steps(task.request, RunOptions(
                    on_text=task.on_text, should_stop=task.cancelled.is_set)))
            kind = next(task.steps)
        except StopIteration as done:
            self._spend(task.phase, t)
            self._end(task, done.value, None)
            return
        except BaseException as e:  # noqa: BLE001 - handed to the task's owner (SystemExit too)
            self._spend(task.phase, t)
            self._end(task, None, e)
            if not isinstance(e, Exception):
                raise
            return
        task.phase = "prefill" if kind == PREFILL else "generate"
        self._spend(task.phase, t)
        if kind == SHOWN:
            t = self.clock()
            with self.cond:  # a request or a call that comes stops a riding batch too (it may be long: pace.py)
                self.engine.interruptible(not self.waits())
            try:
                task.ride.step()
            finally:
                self.engine.interruptible(False)
            self._spend("grow_riding", t)
        with self.cond:  # generation takes turns; a prefill goes on first
            if task.phase == "generate" and len(self.running) > 1 and self.running[0] is task:
                self.running.append(self.running.pop(0))

    def _end(self, task: RequestTask, out, err) -> None:
        with self.cond:
            if task in self.running:
                self.running.remove(task)
        task.steps = None
        if task.ride is not None:
            task.ride.close()  # (its growth's progress stays in its slot)
        now = self.clock()
        # Right after a keystroke the next request cannot come before the editor's debounce (pace.py)
        grace = self.policy.idle_grace
        grace = 0.0 if self.engine.pace.window_s(now) > grace else grace
        self.save_at, self.idle_at = now + self.policy.save_delay, now + grace
        self.engine.mark_active()
        task.resolve(out, err)  # its callbacks (the reply) run here, their failures logged
        if self.follow is not None:  # (after the reply: it never waits for this)
            self.follow.after(task.request, err)

    def _background_step(self) -> None:
        """One step of background work: the started task, else the next (the latest file's first)."""
        t = self.clock()
        if self.background.preempted():  # work for a due request goes before a started task of another kind
            self._close_background()
        with self.cond:
            task = self.background.start(self.last_path)
            if task is None:
                return
            if self.waits():
                return  # foreground work came since the loop chose this
            now = self.clock()
            usual = self.engine.growth.patience_s  # (an idle chunk's time; 0: never holds)
            need = 0.0 if task.for_request else usual / self.policy.hold_share
            hold = self.engine.pace.hold_s(need, now)
            if hold > 0:  # a request is due before the smallest batch would end: it would stop it
                self.idle_at = now + hold
                self.held_at = self.held_at or now
                return
            self.engine.interruptible(True)  # under the lock: a request queued from now on stops it
        try:
            if task.steps is None:
                if (job := task.fn(self.engine, self.waits)) is None:
                    raise StopIteration
                task.steps = Steps(job)
            next(task.steps)
        except StopIteration:
            self.background.drop()
        except Cancelled as e:  # a request came inside a batch or while it tokenized: go on later
            if isinstance(e, Interrupted):
                self.spent["interrupted"] = self.spent.get("interrupted", 0.0) + e.lost_s
            self.background.requeue()
        except Exception:  # noqa: BLE001 - background work never takes the engine thread down
            log.exception("background work failed")
            self.background.drop()
        finally:
            self.engine.interruptible(False)
            self._spend(f"idle_{task.key[0] if isinstance(task.key, tuple) else task.key}", t)

    def _close_background(self) -> None:
        """Stop the started background task (what it computed stays in its slot) and queue it again."""
        task = self.background.current
        if task is None or task.steps is None:
            return
        try:
            task.steps.throw(Cancelled())
        except (Cancelled, StopIteration):
            pass
        except Exception:  # noqa: BLE001
            log.exception("background work failed")
            self.background.drop()
            return
        self.background.requeue()

    def _call(self, fn, fut: Future) -> None:
        try:
            fut.set_result(fn(self.engine))
        except BaseException as e:  # handed to the caller; SystemExit and the like end the thread too (revived)
            fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
