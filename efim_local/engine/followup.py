"""The background work a request leaves behind, queued by the engine itself (not by whoever serves
the request): after each request on a file, its repository context if stale, the answer's greedy
continuation, and growth if the latency budget reduced the plan, in that order of running."""

from __future__ import annotations

import logging

from ..errors import Cancelled
from ..request import CompletionRequest
from .run import greedy

log = logging.getLogger("efim.engine")


class FollowUp:
    """Queues a file's follow-up work on a scheduler's background queue (``Scheduler.add_background``)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.engine = scheduler.engine

    def after(self, req: CompletionRequest, err: BaseException | None) -> None:
        """A request ended (engine thread), answered (``err`` None) or not: most are cancelled by the
        next keystroke, and their plan is the next one's."""
        path = req.path
        answered = err is None
        if greedy(req.how) and (answered or isinstance(err, Cancelled)):
            # Cancelled too: the keys that cancel an answer mostly type its first characters, and the
            # request after the next pause types through its trail (instant.py); a few tokens do.
            self.ahead_later(path, None if answered else self.engine.policy.ahead_cancelled)
        if self.engine.reduced(path):
            self.scheduler.add_background(lambda engine, should_stop: engine.growth.grow_steps(path, should_stop),
                                          key=("grow", path), path=path)
        self.repo_check(path)

    def ahead_later(self, path: str, limit: int | None = None) -> None:
        """While the answer is shown, extend its greedy continuation (the next completion after an
        accept; ``limit``: by at most so many tokens): first among the file's background work but a
        repository rebuild."""
        self.scheduler.add_background(lambda engine, should_stop: engine.trail.ahead_steps(path, should_stop, limit),
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
