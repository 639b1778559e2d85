"""The user's pace: when the next request can come at the earliest.

Editors ask for a completion only after typing pauses for a debounce (the Neovim plugin: 150 ms),
and every keystroke reaches the daemon at once as a ``didChange``. So right after a keystroke no
request can come for about the debounce, and idle work can spend that window on one bigger batch
(a prefill batch of 16-24 tokens runs at 150-165 tokens/s on the 0.5B shape on 2 cores, one of 8 at
about 120; docs/benchmarks-context.md, "sixth session") instead of chunks sized for a request that
may come any moment. The debounce is learned from what the editor does: the least time between a
keystroke and the request after it, over recent requests. An editor that asks at once (no debounce)
teaches 0, and nothing changes. A wrong guess costs no latency: a request that comes inside the
window still stops the batch at once (``Engine.interrupt``); only the batch's work is lost.
"""

from __future__ import annotations

import threading
import time
from collections import deque

SAMPLES = 16  # recent requests the debounce is learned from
MIN_SAMPLES = 4  # fewer: no guess
MAX_GAP_S = 2.0  # a request later than this after the last keystroke tells nothing of the debounce
MAX_DEBOUNCE_S = 1.0
SLACK_S = 0.03  # how late after the debounce a request still comes (IPC, the editor's timer)


class Pace:
    """Keystrokes and requests as they come (any thread); ``window_s()``: how long from now no request
    is expected (0 when that is not known)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.key_at = 0.0  # perf_counter() of the latest keystroke (didChange)
        self.request_at = 0.0  # and of the latest request
        self.gaps: deque[float] = deque(maxlen=SAMPLES)  # keystroke -> next request, seconds

    def typed(self, now: float | None = None) -> None:
        """A document changed (a keystroke)."""
        self.key_at = time.perf_counter() if now is None else now

    def requested(self, now: float | None = None) -> None:
        """A completion request came."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            self.request_at = now
            gap = now - self.key_at
            if 0 <= gap <= MAX_GAP_S:
                self.gaps.append(gap)

    @property
    def debounce_s(self) -> float:
        """The least keystroke-to-request time seen lately (0 until enough requests were seen)."""
        with self._lock:
            return min(min(self.gaps), MAX_DEBOUNCE_S) if len(self.gaps) >= MIN_SAMPLES else 0.0

    def window_s(self, now: float | None = None) -> float:
        """Seconds from ``now`` before which no request is expected (0: one may come any moment)."""
        now = time.perf_counter() if now is None else now
        return max(0.0, self.key_at + self.debounce_s - now)

    def hold_s(self, need_s: float, now: float | None = None) -> float:
        """Seconds idle work should wait rather than start a batch of ``need_s``: a request is due (a
        keystroke came since the last request, and the debounce after it ends before the batch would),
        and a batch it stops is lost. 0: go on."""
        now = time.perf_counter() if now is None else now
        debounce = self.debounce_s
        if need_s <= 0 or not debounce or self.key_at <= self.request_at:
            return 0.0
        due = self.key_at + debounce
        if due - now >= need_s or now >= due + SLACK_S:
            return 0.0
        return due + SLACK_S - now
