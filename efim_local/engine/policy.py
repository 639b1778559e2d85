"""The engine's timing and scheduling policy: every tunable in one object, and the clock it reads.

The engine gets a :class:`Policy` in its constructor (``Engine(..., policy=None)``: the defaults) and
keeps it as ``engine.policy``; the objects that decide on their own get it from the engine: the
user's pace (``pace.py``), the learned speed (``speed.py``), the free cores (``cpu.py``), the
scheduler (``scheduler.py``) and the decoder's drafts (``drafts.py``). ``clock`` is the time all
of them decide by (``time.perf_counter`` by default): a test passes a clock of its own and
advances it by hand, so the scheduler's policy is tested without a model and without sleeps
(tests/unit/test_policy.py).

Only timing and scheduling policy lives here: what a prompt, an answer or a saved state is (stop
rules, file and context sizes, formats) stays beside the code it shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Policy:
    # -- the clock -------------------------------------------------------------------------------
    clock: Callable[[], float] = time.perf_counter  # seconds; what every decision below is timed by

    # -- the scheduler (scheduler.py) ------------------------------------------------------------
    save_delay: float = 0.5  # seconds of quiet before dirty slots are saved: a burst of keystrokes is saved once
    hold_share: int = 4  # idle work waits for a due request when less is left than 1/hold_share of a usual chunk
    idle_grace: float = 0.05  # seconds after a reply before idle work starts: a request right behind it never waits

    # -- idle chunks (Growth.idle_chunk) ---------------------------------------------------------
    quiet_share: float = 0.5  # an idle chunk may last this share of the time since the last foreground work
    window_share: float = 0.9  # and this share of the time before the next request can come (the speed is an estimate)

    # -- near plans (Growth.near_plan, Engine.size_near) -----------------------------------------
    # A near plan is grown first only if the learned speed computes it within this; the engine sizes the
    # near window to fit (Engine.size_near): on the 1.5B shape (35 tokens/s here) an eighth of the room
    # took 18 s, and the window's context came that much later (24% of the full plans on the efim trace
    # fell to 8%); a thirty-second, 118 tokens, takes about 4 s.
    near_max_ms: float = 5000
    near_regrow: float = 0.75  # of near_max_ms, within which a bigger near window must compute to grow back
    # Seconds after a change of the near window's size before it grows back: a fresh daemon's speed swings
    # while it learns (the 1.5B shape's went 1/16, 1/32, 1/16, 1/32 in its first minute), and each change
    # moves near windows. (Holding a shrink back too kept a first guess too big for 30 s: 1.5B context 20% -> 8%.)
    near_resize_s: float = 30.0
    # A reduced plan whose cached head (from the window's top) holds this many near windows' worth grows
    # its window, not a near plan: on the click trace's jumps within a file, the 1.5B shape's answers
    # from such heads and the lines nearest the cursor scored better than from near plans.
    head_over_near: int = 4
    begun: int = 16  # tokens of a near plan past its head that a slot must hold for it to count as begun

    # -- growth's stages and a keystroke taking them (Runner.adopt_growth, run.stage_ends) --------
    stale: int = 8  # typed tokens a passed stage may lack before growth brings it up to date
    adopt_share: float = 0.5  # of the budget a keystroke may spend to take growth's progress
    adopt_gain: int = 16  # it takes it when that adds at least 1/16 of the full plan's context (or completes it)
    adopt_min: int = 64  # tokens: less is not worth a keystroke's time
    stages: int = 8  # growth computes a plan's suffix in steps of an eighth of its context (a keystroke takes each)
    stage_min: int = 64  # tokens: the smallest stage

    # -- the trail: an answer's greedy continuation, computed ahead (Trail.ahead_steps) -----------
    # Tokens past what the user typed that the trail of a cancelled answer is extended to while the
    # user types on (FollowUp.after, Runner.keystroke_steps): the request after the next pause is
    # then answered from it if the keys typed its start (paced replay, 0.5B: most answers are
    # cancelled after a token or two, and their next ones asked it all again).
    ahead_cancelled: int = 16
    # While the file's plan is reduced (growth has work), a cancelled answer's trail and a keystroke's
    # keep at most this lead: enough for an instant first ghost; the rest of the engine's time goes
    # to context (an answer's own continuation stays whole: an accept is answered from it). Paced efim
    # trace, 0.5B, two runs each: 58.0, 60.3% useful with context 78-85% of the full plan, against
    # 47.7, 52.7% with 41-55% unbounded (2026-11-28; the trail took 36 of the replay's 107 s).
    ahead_reduced: int = 4

    # -- an answer begun at the keystroke (FollowUp.typed, Runner.keystroke_steps) ---------------
    # Each keystroke that leaves the trail starts the answer at once, with the options of the file's
    # last request; the request after the editor's debounce takes it over with its first tokens (on the
    # paced efim trace, half the requests had under 80 ms before the next key: a token or two).
    answer_at_keystroke: bool = True
    # Tokens it generates: a ghost's first characters, before the request takes it over and generates
    # the rest; the idle time left before the next keystroke goes to growth (paced efim trace, three
    # runs each: 2 tokens 53.3-55.0% useful, 4 tokens 51.3-53.7%; two runs with 8: 49.3, 52.3%).
    keystroke_tokens: int = 2

    # -- interrupting background work (Engine.interrupt) -----------------------------------------
    # Below this much context (prompt tokens of prefix and suffix) the latest answer was starved: a
    # request then waits for the background batch it lands in (growth) rather than drop it.
    starved: int = 1024

    # -- restoring saved states (reuse.py) -------------------------------------------------------
    restore_min_gain: int = 32  # restore a saved state only if it saves at least this many tokens

    # -- the user's pace: the editor's debounce (pace.py) ----------------------------------------
    debounce_samples: int = 16  # recent requests the debounce is learned from
    debounce_min_samples: int = 4  # fewer: no guess
    max_gap_s: float = 2.0  # a request later than this after the last keystroke tells nothing of the debounce
    max_debounce_s: float = 1.0  # the most debounce learned
    slack_s: float = 0.03  # how late after the debounce a request still comes (IPC, the editor's timer)
    # The debounce is the 1/debounce_quantile-th smallest gap: a few requests asked at once (an accepted
    # suggestion's next one, a manual trigger, another client's) do not turn it off.
    debounce_quantile: int = 4
    # Keystrokes in a row whose debounce passed without a request (typing where no completion is asked,
    # another client's edits): idle work stops waiting for requests until one comes.
    max_misses: int = 3

    # -- the learned prefill speed (speed.py) ----------------------------------------------------
    speed_decay: float = 0.95  # weight kept by past observations at each new one
    speed_min_tokens: int = 8  # smaller prefills are dominated by fixed overheads: not informative

    # -- free cores: automatic threads (cpu.py) --------------------------------------------------
    # Other processes' load that takes a core away, in cores: a core-bound process shows as ~1.0; an
    # editor, or the benchmark's own client, as a fraction (which must not halve the threads).
    cores_taken: float = 0.75
    min_ran: float = 0.05  # below this much of our own run time in a window (s per s), our wait ratio is noise
    cores_rise: int = 2  # windows in a row that must show more free cores before the count rises
    cpu_probe_s: float = 0.25  # status's own window (s)
    cpu_probe_reuse_s: float = 5.0  # and how old its last one may be for a new one to start from it

    # -- drafts: speculative decoding (drafts.py) ------------------------------------------------
    max_draft: int = 8  # drafted tokens per verification with every core free (half that when others use some)
    draft_history: int = 8  # earlier completions searched for n-grams
    draft_low_accept: float = 0.25  # below this share of drafted tokens taken (smoothed), drafting pauses
    draft_pause: int = 16  # tokens decoded plainly before drafting probes again
    draft_plain_every: int = 48  # a plain decode after this many tokens keeps its cost known
    draft_smooth: float = 0.3  # weight of the latest verification in the smoothed acceptance (and costs)
