"""Free cores: how much of the CPU other processes leave to this one, read from ``/proc``.

ggml's threads meet at a barrier after every layer, so a thread whose core another process keeps
busy stalls all the others: on 2 cores with one spinning process, a 17-token prefill took 300-400 ms
with 2 threads where 1 thread takes about 140 ms. With automatic threads (the default), the engine
decodes with as many threads as there are free cores, checked at most every ``every`` seconds
before each decode, so one long answer adapts too (a few small reads of ``/proc``: no work on the
keystroke path worth counting). The window is the time since the last check: after a long pause it
is the pause's average load.

``efim status`` asks :meth:`FreeCores.measure`: a window of its own (``cpu_probe_s``, taken again
only when the last one is older), since the engine's last window may be a long pause's average, or,
in a one-shot ``efim status``, none at all (it showed ``cores_used_by_others 0.0`` at a load of 3).

Before the first window is ``every`` s old (an in-process run decodes right after the engine
starts), the count comes from the runnable tasks at that moment (``procs_running``, less this
thread): the first prefill is one long decode that no later check can shorten.

What other processes *used* understates what they *want* while this process decodes: its spinning
threads take a share of every core, so a core-bound process beside two decoding threads on two
cores gets only about 2/3 of a core. The scheduler's per-thread run-queue wait
(``/proc/self/task/*/schedstat``) says how much this process was squeezed; the others were squeezed
alike, so their use divided by the share of runnable time that actually ran is their demand.

The costs are not symmetric: a thread too many beside a busy process stalls every layer (9x slower
on 2 cores), a thread too few costs at most that core's share. So the count falls on one window
and rises only when ``cores_rise`` windows in a row agree: one noisy short window (a few jiffies) never
puts a second thread beside a spinning process.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .policy import Policy  # the thresholds and windows: cores_taken, min_ran, cores_rise, cpu_probe_s


@dataclass
class _Snap:
    t: float
    total: int  # jiffies, all CPUs, busy or not
    busy: int  # jiffies spent by anyone
    own: int  # jiffies spent by this process (all its threads)
    ran: int = 0  # ns this process's live threads ran (schedstat)
    waited: int = 0  # ns they were runnable but waited for a CPU


def _schedstat() -> tuple[int, int]:
    """(ns run, ns waited on a run queue) summed over this process's threads; (0, 0) without schedstat."""
    ran = waited = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                a, b = f.read().split()[:2]
            ran, waited = ran + int(a), waited + int(b)
        except (OSError, ValueError):
            continue  # the thread ended, or no schedstat in this kernel
    return ran, waited


def _snap(cpus: frozenset[int], clock: Callable[[], float]) -> _Snap | None:
    """Jiffies of the CPUs this process may run on (its affinity: a busy CPU outside it is no
    concern), and of this process."""
    try:
        with open("/proc/stat", "rb") as f:
            lines = [ln.split() for ln in f if ln[:3] == b"cpu" and ln[3:4].isdigit()]
        with open("/proc/self/stat", "rb") as f:
            mine = f.read()
        total = busy = 0
        for ln in lines:
            if int(ln[0][3:]) in cpus:
                vals = [int(x) for x in ln[1:9]]  # user nice system idle iowait irq softirq steal
                total += sum(vals)
                busy += sum(vals) - vals[3] - vals[4]
        rest = mine[mine.rindex(b")") + 2:].split()  # after the command name, which may hold spaces
        own = int(rest[11]) + int(rest[12])  # utime, stime: all threads
    except (OSError, ValueError, IndexError):
        return None
    return _Snap(clock(), total, busy, own, *_schedstat())


def _running_others() -> int | None:
    """Tasks runnable right now besides this thread (/proc/stat ``procs_running``: system-wide)."""
    try:
        with open("/proc/stat", "rb") as f:
            for ln in f:
                if ln.startswith(b"procs_running "):
                    return max(0, int(ln.split()[1]) - 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def demand(used: float, ran: float, waited: float, cores: int, min_ran: float = Policy.min_ran) -> float:
    """Other processes' demand in cores, from what they ``used`` (cores) while this process's
    threads ran ``ran`` and waited ``waited`` (seconds of thread time per second of window): under
    a fair scheduler everyone runnable waits alike, so use / (share that ran) is what they wanted.
    Below ``min_ran`` of our own run time the wait ratio is noise: their use is their demand."""
    if ran < min_ran or waited <= 0:
        return min(float(cores), used)
    return min(float(cores), used * (ran + waited) / ran)


class FreeCores:
    """Counts the cores other processes leave free (``sample()``), over windows of at least ``every`` s."""

    def __init__(self, every: float = 0.5, policy: Policy | None = None):
        self.policy = policy = Policy() if policy is None else policy
        self.clock = policy.clock
        self.cpus = frozenset(os.sched_getaffinity(0))
        self.cores = len(self.cpus)
        self.every = every
        self.others = 0.0  # cores' worth of CPU other processes wanted in the last window
        self.free = self.cores
        self._last = _snap(self.cpus, self.clock)
        self._first = True  # no window measured yet
        self._rising: list[int] = []  # the last windows' counts, while each showed more than ``free``
        self._probe: _Snap | None = None  # where status's last window ended (measure)
        self._lock = threading.Lock()

    def sample(self) -> int:
        """Free cores now (at least 1): the last window's, re-measured if it is ``every`` s old."""
        last = self._last
        if last is None or self.clock() - last.t < self.every:
            if self._first:  # no window yet: the tasks runnable now
                self._first = False
                others = _running_others()
                if others is not None:
                    self._set(min(float(self.cores), float(others)))
            return self.free
        now = _snap(self.cpus, self.clock)
        others = self._between(last, now)
        if others is None:
            return self.free
        self._set(others)
        self._first, self._last = False, now
        return self.free

    def measure(self) -> float:
        """Other processes' demand now, in cores (``efim status``; any thread), over a window of its
        own: the last one's end if it is at most ``cpu_probe_reuse_s`` old, else a new one of ``cpu_probe_s``
        (a wait). A window shorter than ``cpu_probe_s`` is not measured again. The count follows it, and
        the engine's next window starts at its end."""
        now = _snap(self.cpus, self.clock)
        probe = self._probe
        if now is None:
            return self.others
        if probe is not None and now.t - probe.t < self.policy.cpu_probe_s:
            return self.others
        if probe is None or now.t - probe.t > self.policy.cpu_probe_reuse_s:
            probe = now
            time.sleep(self.policy.cpu_probe_s)
            now = _snap(self.cpus, self.clock)
        others = self._between(probe, now) if now is not None else None
        if others is not None:
            self._set(others)
            # The engine's next window starts here (not from a long pause before it); no estimate
            # from the tasks runnable at one moment either.
            self._probe = self._last = now
            self._first = False
        return self.others

    def _between(self, last: _Snap, now: _Snap | None) -> float | None:
        """Other processes' demand (cores) between two snapshots; None if no time passed."""
        if now is None or now.total <= last.total:
            return None
        used = max(0, (now.busy - last.busy) - (now.own - last.own)) / (now.total - last.total) * self.cores
        span = max(now.t - last.t, 1e-3) * 1e9
        ran, waited = max(0, now.ran - last.ran) / span, max(0, now.waited - last.waited) / span
        return demand(used, ran, waited, self.cores, self.policy.min_ran)

    def _set(self, others: float) -> None:
        with self._lock:  # the engine's thread and a status call's
            self.others = others
            free = max(1, min(self.cores, self.cores - int(others + 1 - self.policy.cores_taken)))
            self._rising = self._rising + [free] if free > self.free else []
            if free < self.free or len(self._rising) >= self.policy.cores_rise:
                self.free, self._rising = min(self._rising or [free]), []
