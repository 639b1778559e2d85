"""The background work the engine decides on, queued by the engine itself (not by whoever serves
the request or relays the editor's notes):

- after each request on a file: its repository context if stale, the answer's greedy continuation,
  and growth if the latency budget reduced the plan, in that order of running;
- when a file is opened, the cursor settles, a file changes on disk: the file's prefill (warm) at its
  cursor, and its repository context when that changed;
- at start: calibration (the latency budget's prefill speed).

The daemon only translates its protocol into these calls (``daemon/handlers.py``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from ..errors import Cancelled
from ..prompt.document import read_source
from ..request import CompletionRequest, Options
from .files import MAX_FILES
from .run import greedy

log = logging.getLogger("efim.engine")

# Idle prefill tokenizes the whole text first (interruptibly: engine/tokenizing.py); this bounds the
# background tokenizing a document can cost. Larger documents are prefilled by their first request.
IDLE_MAX_CHARS = 1 << 20


class FollowUp:
    """Queues a file's follow-up work on a scheduler's background queue (``Scheduler.add_background``),
    and notes for the engine thread (``Scheduler.post``). Called from any thread: what it reads of the
    engine here (open files, the repository context) is thread-safe."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.engine = scheduler.engine
        self.how: OrderedDict[str, Options] = OrderedDict()  # each file's last request's options (engine thread)

    # -- the daemon's start and the editor's notes -----------------------------------------------
    def start(self) -> None:
        """The daemon starts: measure the prefill speed (the latency budget's) when idle."""
        calibrate = lambda engine, should_stop: engine.growth.calibrate_steps(should_stop)
        self.scheduler.add_background(calibrate, key="calibrate")

    def opened(self, path: str) -> None:
        """A document was opened: prefill it when idle, and compute its repository context."""
        self.warm_later(path)
        if self.engine.repo is not None:
            self.repo_later(path)

    def cursor(self, path: str, cursor: int) -> None:
        """The cursor settled in an open document: prefill the plan anchored there, when idle."""
        # The cursor is planning's (the engine thread's, engine/files.py): noted there between two steps
        # (light: background work goes on), before the idle prefill queued next.
        self.scheduler.post(lambda engine: engine.files.note_cursor(path, cursor), light=True)
        self.warm_later(path, cursor)
        repo = self.engine.repo
        if repo is not None:  # a visited range (T2 of the project's other files); this file's T2 may be stale
            repo.visit(path, cursor)
            if repo.stale(path):
                self.repo_later(path)

    def definitions(self, path: str, pairs: list[tuple[str, int]]) -> int:
        """Where the editor resolved the names ``path`` imports ((file, line) pairs): they join its
        repository context (T1), rebuilt when idle if they changed. How many it keeps."""
        changed, kept = self.engine.repo.set_definitions(path, pairs) if self.engine.repo else (False, 0)
        if changed:
            self.repo_later(path)
        return kept

    def changed_on_disk(self, path: str) -> None:
        """A file changed on disk. One the engine served (open, or asked about): forget its plan and
        prefill it in idle time. Any: the repository context of the project's open files that import it
        or name its definitions is rebuilt. A file never served costs the engine nothing (a log another
        program appends to, a checkout's hundred files: warming them would stop idle work at each write
        and fill the slots with files nobody asked about)."""
        if self.engine.files.get(path) is not None:
            self.scheduler.post(lambda e: e.forget(path))
            self.warm_later(path)
        if self.engine.repo is not None:
            for other in self.engine.repo.saved(path):
                self.repo_later(other)

    def closed(self, path: str) -> None:
        """A document was closed (by every connection)."""
        if self.engine.repo is not None:
            self.engine.repo.closed(path)

    def typed(self, path: str, version: int) -> None:
        """A keystroke made ``version`` of an open document: begin the answer at its caret now, as
        the request after the editor's debounce will ask it (with the file's last request's options),
        unless the keystroke typed on what the file's trail knows (Runner.keystroke_steps)."""
        if not self.engine.policy.answer_at_keystroke or not self.engine.backend.local_kv:
            return  # (replicas: a team's servers would answer every keystroke)

        def answer(engine, should_stop):
            how = self.how.get(path)
            return None if how is None else engine.runner.keystroke_steps(path, version, how, should_stop)

        self.scheduler.add_background(answer, key=("keystroke", path), path=path, first=True, for_request=True)

    def accepted(self, path: str) -> None:
        """The editor took (some of) the answer: the next keystroke takes what was accepted, answered
        from the continuation computed ahead."""
        self.scheduler.post(lambda engine: engine.instant and engine.instant.note_accepted(path))

    def warm_later(self, path: str, at: int | None = None) -> None:
        """Prefill ``path`` (its open text, else the file) at offset ``at`` (default: its last
        cursor; none yet: the head of its plans from the file's top), when idle. An open document
        edited in the meantime is skipped: the cursor that came with this task is stale, and the
        requests of the typing take over."""
        f = self.engine.files.get(path)
        version = f.version if f is not None and f.open else None

        def warm(engine, should_stop):
            f = engine.files.get(path)
            with engine.files.lock:
                if version is not None and (f is None or not f.open or f.version != version):
                    return None
                text = f.text if f is not None and f.open else None
                cursor = at if at is not None else f.cursor if f is not None else None
            if text is None:
                try:  # a regular file only, bounded: never a FIFO or /dev/zero on the engine thread
                    text = read_source(path, follow=False)
                except Exception:  # noqa: BLE001 - gone, unreadable: nothing to warm
                    return None
            if len(text) > IDLE_MAX_CHARS:
                return None
            cursor = None if cursor is None else min(cursor, len(text))  # None: Growth.top_steps
            return engine.growth.warm_steps(path, text, cursor, should_stop)

        self.scheduler.add_background(warm, key=("warm", path), path=path)

    # -- after a request ---------------------------------------------------------------------------
    def after(self, req: CompletionRequest, err: BaseException | None) -> None:
        """A request ended (engine thread), answered (``err`` None) or not: most are cancelled by the
        next keystroke, and their plan is the next one's."""
        path = req.path
        answered = err is None
        if greedy(req.how) and not req.how.ignore_eog:  # what a keystroke's answer asks (typed)
            self.how[path] = req.how
            self.how.move_to_end(path)
            while len(self.how) > MAX_FILES:
                self.how.popitem(last=False)
        if greedy(req.how) and (answered or isinstance(err, Cancelled)):
            # Cancelled too: the keys that cancel an answer mostly type its first characters, and the
            # request after the next pause types through its trail (instant.py); a few tokens do.
            if answered:
                self.ahead_later(path)
            else:  # (nothing of it typed yet)
                self.ahead_later(path, self.engine.policy.ahead_cancelled, typed=0)
        if self.engine.reduced(path):
            self.scheduler.add_background(lambda engine, should_stop: engine.growth.grow_steps(path, should_stop),
                                          key=("grow", path), path=path)
        self.repo_check(path)

    def ahead_later(self, path: str, limit: int | None = None, typed: int | None = None) -> None:
        """While the answer is shown, extend its greedy continuation (the next completion after an
        accept; ``limit``, ``typed``: as ``Trail.ahead_steps``): first among the file's background work
        but a repository rebuild."""
        self.scheduler.add_background(
            lambda engine, should_stop: engine.trail.ahead_steps(path, should_stop, limit, typed),
            key=("ahead", path), path=path, first=True)

    def repo_check(self, path: str | None) -> None:
        """Rebuild the file's repository context if its imports or the project changed."""
        try:
            repo = self.engine.repo
            if repo is not None:
                repo.visit(path)  # where the user works: T2 of the project's other files
                if repo.stale(path):
                    self.repo_later(path, first=True)
        except Exception:  # noqa: BLE001 - optional work never fails the engine thread
            log.exception("repository context check failed")

    def repo_later(self, path: str, first: bool = False) -> None:
        """(Re)compute the repository context of ``path`` and switch its plan to it, while idle
        (engine/repoctx.py): the old plan serves until the new one is prefilled. ``first`` (after a
        request): before the file's growth, which would grow a plan about to be replaced, and would
        starve the rebuild while the user types."""
        self.scheduler.add_background(lambda engine, should_stop: engine.repo_build.rebuild_steps(path, should_stop),
                                      key=("repo", path), path=path, first=first)
