"""What the scheduler runs (``scheduler.py``): requests, and background work."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..request import CompletionRequest
from .background import Alongside


@dataclass(eq=False)
class RequestTask:
    """A completion to run. ``done(completion, error)`` is called on the engine thread when it ends
    (exactly one of them is None); ``key`` names its document: a newer task with the same key
    supersedes it."""

    key: Any
    request: CompletionRequest
    done: Callable[[Any, BaseException | None], None]
    on_text: Callable[[str], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)  # of the scheduler's clock (Policy.clock's default)
    max_wait: float = 30.0  # seconds it may wait in the queue before it is answered "busy"
    steps: Any = None  # the running generator
    phase: str = "queued"  # queued | prefill | generate
    ride: Alongside | None = None
    owner: Any = None  # the caller's own record of it (the daemon's job)


@dataclass(eq=False)
class BackgroundTask:
    """``fn(engine, should_stop)``: returns a generator of steps, or None when it did its work at once."""

    key: Any
    fn: Callable
    path: str | None = None  # the file it works for (the latest request's file goes first)
    steps: Any = None
