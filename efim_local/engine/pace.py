"""The user's pace: when the next request can come at the earliest.

Editors ask for a completion only after typing pauses for a debounce (the Neovim plugin: 150 ms),
and every keystroke reaches the daemon at once as a ``didChange``. So right after a keystroke no
request can come for about the debounce, and idle work can spend that window on one bigger batch
(on the 0.5B shape on 2 cores a batch of 16 tokens prefills 149 tokens/s, one of 8 about 120;
docs/benchmarks-context.md, "sixth session") instead of chunks sized for a request that may come any
moment. The debounce is learned from what the editor does: a low quantile of the times between a
keystroke and the request after it, over recent requests. An editor that asks at once (no debounce)
teaches 0, and nothing changes. A request that comes sooner than learned stops the batch as any
request does (``Engine.interrupt``: at once, or at its end if little is left); only the batch's
work is lost.
"""

from __future__ import annotations

import threading
from collections import deque

from .policy import Policy


class Pace:
    """Keystrokes and requests as they come (any thread); ``window_s()``: how long from now no request
    is expected (0 when that is not known)."""

    def __init__(self, policy: Policy | None = None):
        self.policy = policy = Policy() if policy is None else policy
        self.clock = policy.clock
        self._lock = threading.Lock()
        self.key_at = 0.0  # clock() of the latest keystroke (didChange)
        self.request_at = 0.0  # and of the latest request
        self.misses = 0  # keystrokes in a row whose debounce passed without a request
        self.gaps: deque[float] = deque(maxlen=policy.debounce_samples)  # keystroke -> next request, seconds

    def typed(self, now: float | None = None) -> None:
        """A document changed (a keystroke)."""
        now = self.clock() if now is None else now
        debounce = self.debounce_s
        with self._lock:
            if debounce and self.key_at > self.request_at and now > self.key_at + debounce + self.policy.slack_s:
                self.misses += 1
            self.key_at = now

    def requested(self, now: float | None = None) -> None:
        """A completion request came."""
        now = self.clock() if now is None else now
        with self._lock:
            self.request_at, self.misses = now, 0
            gap = now - self.key_at
            if 0 <= gap <= self.policy.max_gap_s:
                self.gaps.append(gap)

    @property
    def debounce_s(self) -> float:
        """The keystroke-to-request time the editor waits (a low quantile of the recent ones; 0 until
        enough requests were seen)."""
        with self._lock:
            if len(self.gaps) < self.policy.debounce_min_samples:
                return 0.0
            return min(sorted(self.gaps)[(len(self.gaps) - 1) // self.policy.debounce_quantile],
                       self.policy.max_debounce_s)

    def window_s(self, now: float | None = None) -> float:
        """Seconds from ``now`` before which no request is expected (0: one may come any moment)."""
        now = self.clock() if now is None else now
        debounce = self.debounce_s
        with self._lock:
            return max(0.0, self.key_at + debounce - now) if debounce else 0.0

    def hold_s(self, need_s: float, now: float | None = None) -> float:
        """Seconds idle work should wait rather than start a batch of ``need_s``: a request is due (a
        keystroke came since the last request, and the debounce after it ends before the batch would),
        and a batch it stops is lost. 0: go on."""
        now = self.clock() if now is None else now
        debounce = self.debounce_s
        with self._lock:
            if need_s <= 0 or not debounce or self.key_at <= self.request_at or self.misses >= self.policy.max_misses:
                return 0.0
            due = self.key_at + debounce
        slack = self.policy.slack_s
        if due - now >= need_s or now >= due + slack:
            return 0.0
        return due + slack - now
