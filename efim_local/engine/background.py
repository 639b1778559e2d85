"""Background work: everything the engine does for a request that has not come yet.

- **growth** puts back the context a latency budget took from a file's plan (idle, or riding along
  a request's generation: :class:`Alongside`);
- the **cursor and open prefill** computes the plan a request at a cursor will make;
- **calibration** measures the prefill speed the budget needs and builds the healer's index;
- the **interruptible tokenizer** (``tokenizing.py``) lets idle work tokenize a large document without
  making a request wait.

Each task is a generator of steps (one prefill chunk each) that the scheduler runs when no request
waits, and closes (Cancelled) when one comes; it never calls into a request.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

import numpy as np

from ..errors import Cancelled
from ..request import CompletionRequest, Options
from ..prompt.windows import text_end
from .decode import PREFILL, SHOWN
from .run import PROBE, RunOptions, stage_ends
from .steps import Steps

log = logging.getLogger("efim.engine")


class Growth:
    """An engine's work for requests that have not come yet (the module's docstring): growth, its
    near plans and stages, the cursor and open prefill, calibration, and the size of idle chunks.
    Its engine builds it and owns it (``engine.growth``)."""

    def __init__(self, engine):
        self.engine = engine
        # How long an idle chunk of the usual size takes (idle_chunk measures it; no local decoding: none).
        self.patience_s = engine.config.idle_chunk_ms / 1e3 if engine.decoder is not None else 0.0

    # -- growth -----------------------------------------------------------------------------------
    def reduced(self, path: str | None) -> bool:
        """Whether the budget reduced ``path``'s current plan (growth has work to do)."""
        engine = self.engine
        f = engine.files.get(path) if path else None
        return f is not None and f.session is not None and f.session.anchor is not None and f.session.anchor.reduced

    def grow_steps(self, path: str, should_stop=None, light: bool = False):
        """Put back the context a latency budget took from ``path``'s plan (steps).

        Prefills the full plan's stable part, and the text typed since the anchor after it (EFIM), in
        another slot than the request's, in chunks of ``idle_chunk`` tokens (Cancelled when
        ``should_stop`` says stop; what was decoded stays in the slot, so the next run goes on from
        there). When it is complete, the file's anchor becomes the full one, so the next keystroke
        finds it cached. ``light``: between a request's tokens (no state saved or restored)."""
        engine = self.engine
        if not self.reduced(path):
            return
        engine.size_near()  # before the planner is copied (repository context) and the plans are made
        state = engine.files.get(path)
        session = state.session
        partial = session.anchor
        planner = engine.planner_for(session)  # with the file's repository context (repoctx.py)
        full = planner.full_anchor(partial, engine.config.max_tokens)
        chunk = self.riding_chunk if light else self.idle_chunk
        ro = RunOptions(path=path, should_stop=should_stop, chunk=chunk, idle=True, light=light, job="grow")
        near = self.near_plan(planner, path, full, partial)
        if near is not None:  # first the near window's plan: seconds, where the whole window takes tens
            nearest = self.nearest_plan(planner, full, partial, near)
            if nearest is not None:  # and before it the nearest window's: under a second (too small for stages,
                # each of which would take a slot of its own)
                yield self.staged_steps(planner, session, nearest, ro, 0, leave=True)
            grown = yield self.staged_steps(planner, session, near, ro, len(partial.suffix_tokens), leave=True)
            # Then the window grows at least as long before another near plan starts (a cursor that
            # jumps every few seconds would otherwise spend all growth on near plans, never the window).
            state.near_until = engine.policy.clock() + engine.speed.predict_ms(len(grown), 0) / 1000
        tokens = yield self.staged_steps(planner, session, full, ro, len(partial.suffix_tokens))
        if partial.same_place(session.anchor):  # nothing re-anchored the file meanwhile (a keystroke may have
            # taken part of the growth: the same anchor, trimmed less)
            log.debug("%s: grown to the full plan (%d tokens)", path, len(tokens))
            engine.files.set_anchor(path, full)
            engine.reuse.drop_others(path, np.asarray(tokens, dtype=np.int32))
            if engine.instant is not None:
                # The last answer's plan is the reduced one: typing through it would run that plan in the
                # slot that shares most of it, this one, and cut the grown suffix (paced efim trace: the
                # full plan lost within a second, every answer reduced after). The next keystroke plans on
                # the full anchor, whose KV is here.
                engine.instant.forget(path)

    def staged_steps(self, planner, session, anchor, ro: RunOptions, first: int, leave: bool = False):
        """Prefill ``anchor``'s plan (its stable part and the typed text after it) by way of its stages
        (steps; returns its tokens). Each stage's slot is left to the keystrokes (they take it, and growth
        goes on in a copy), the plan's too when ``leave``. A stage growth has passed is computed again
        (with the text typed since) in a copy of the slot that holds the plan further: never at the cost
        of that progress."""
        engine = self.engine
        tokens = planner.stable_tokens(session.layout, anchor, session.typed)
        refresh = replace(ro, keep=tokens[:len(planner.stable_tokens(session.layout, anchor))])
        for stage in self.stages(planner, session, anchor, tokens, first):
            out = yield engine.runner.run_steps(stage, Options(max_tokens=0), refresh)
            engine.slots.slots[out.slot].idle = False
            self.stage_done(ro.path)
            yield PREFILL  # a step ends between two stages too (the next begins with a batch of its own)
        out = yield engine.runner.run_steps(tokens, Options(max_tokens=0), ro)
        if leave:
            engine.slots.slots[out.slot].idle = False
        self.stage_done(ro.path)
        return tokens

    def stage_done(self, path: str) -> None:
        """A stage of growth is computed: the next keystroke takes it (Runner.adopt_growth) rather than
        type through the last answer, whose plan has less context (paced efim trace, 0.5B: answers
        typed through a reduced plan's trail kept its 13-43% of the context for dozens of keys, while
        the full plan's answers were useful for 72% of the requests against 52%)."""
        s = self.engine.instant.shown.get(path) if self.engine.instant is not None else None
        if s is not None and s.context.get("reduced"):
            self.engine.instant.forget(path)

    def held(self, tokens) -> int:
        """How many of ``tokens`` a live slot holds, a busy one too: a request running there keeps its
        prompt's KV, so growth riding along it must not compute that plan again in another slot."""
        engine = self.engine
        return engine.reuse.peek(np.asarray(tokens, dtype=np.int32), busy_ok=True)

    def near_plan(self, planner, path: str, full, partial):
        """The near plan growth computes before ``full`` (planner.near_anchor), or None: when the file's
        window has no near window, the reduced plan ``partial`` already holds the lines it would add, the
        slots already hold it, it would take longer than ``policy.near_max_ms`` at the learned speed, or
        what the window's cached head lacks of its prefix is less than twice the near window (growing the
        window costs little more), or the file's last near plan was done less than its own time ago (the
        window grows meanwhile), or the cached head holds ``policy.head_over_near`` near windows' worth.
        The near window's size is the engine's (``grow_steps`` sizes it first)."""
        engine = self.engine
        policy = engine.policy
        f = engine.files.get(path)
        session = f.session
        near = planner.near_anchor(full, engine.config.max_tokens)
        if (near is None or session.layout != "efim" or not engine.backend.local_kv
                or len(partial.prefix_tokens) - partial.head >= len(near.prefix_tokens)
                or (partial.base == 0 and partial.head >= policy.head_over_near * len(near.prefix_tokens))):
            return None
        peek = self.held
        stable = planner.stable_tokens("efim", near)
        have = peek(stable)
        if (have >= len(stable) or not engine.speed.known
                or engine.speed.predict_ms(len(stable) - have, have) > policy.near_max_ms):
            return None
        begun = have > len(planner.head_tokens(())) + policy.begun
        if not begun and policy.clock() < f.near_until:
            return None  # a new one waits for the window's turn (one begun goes on)
        top = planner.head_tokens(full.prefix_tokens)
        lacks = len(top) - peek(top)
        return near if lacks > 2 * len(near.prefix_tokens) else None

    def nearest_plan(self, planner, full, partial, near):
        """The nearest window's plan growth computes before the near plan ``near``, or None: when the
        window has no nearest window, the near plan has begun (a slot holds some of it past its head),
        the reduced plan ``partial`` starts there already or holds the lines it would add, or the slots
        hold it already."""
        engine = self.engine
        nearest = planner.near_anchor(full, engine.config.max_tokens, nearest=True)
        if nearest is None or partial.base == nearest.base or len(partial.prefix_tokens) - partial.head >= len(
                nearest.prefix_tokens):
            return None
        peek = self.held
        if peek(planner.stable_tokens("efim", near)) > len(planner.head_tokens(())) + engine.policy.begun:
            return None
        stable = planner.stable_tokens("efim", nearest)
        return nearest if peek(stable) < len(stable) else None

    def stages(self, planner, session, full, tokens, first: int = 0) -> list[tuple[int, ...]]:
        """The plans growth computes on its way to ``tokens`` (EFIM), so that a keystroke can take the
        context grown so far at the cost of the tokens typed since (``Runner.adopt_growth``): the full plan
        cut at each of ``run.stage_ends``, then the middle marker and the typed text. The last stage
        growth has passed comes first when it lacks more than ``policy.stale`` tokens of the text typed since
        (which a keystroke taking it would pay for), then those ahead; stages a slot holds are left out."""
        engine = self.engine
        if session.layout != "efim" or not engine.backend.local_kv:  # (replicas: the whole plan at once)
            return []
        typed = tokens[len(planner.stable_tokens("efim", full)):]
        # (A slot a request runs in counts: computing its plan again elsewhere would cut the stage ahead
        # there, and the next idle step would redo it.)
        peek = self.held
        frontier = peek(tokens)
        ends = stage_ends(planner, full, engine.policy, first)
        passed = [e for e in ends if e <= frontier]
        out = []
        for end in passed[-1:] + [e for e in ends if e > frontier]:
            stage = (*tokens[:end], *planner.markers.mid, *typed)
            if peek(stage) < len(stage) - (engine.policy.stale if end <= frontier else 0):
                out.append(stage)
        return out

    # -- prefill and calibration ---------------------------------------------------------------
    def prefill_steps(self, path: str, text: str, cursor: int, should_stop=None):
        """Compute the plan anchored at ``cursor`` as a request there would plan it (within the latency
        budget: the next keystroke finds its own anchor cached), then grow it to the full plan (steps;
        Cancelled when ``should_stop`` says so, keeping what was computed)."""
        engine = self.engine
        req = CompletionRequest(text, cursor, path=path, max_tokens=0)
        ro = RunOptions(should_stop=should_stop, chunk=self.idle_chunk, idle=True, job="warm")
        yield engine.runner.complete_steps(req, ro)
        yield self.grow_steps(path, should_stop)

    def warm_steps(self, path: str, text: str, cursor: int | None, should_stop):
        """:meth:`prefill_steps`, tokenizing interruptibly (a request never waits for the tokenizer).
        No cursor (a file just opened): :meth:`top_steps`."""
        engine = self.engine
        with engine.tokenizer.stopping(should_stop):
            if cursor is None:
                yield self.top_steps(path, text, should_stop)
            else:
                yield self.prefill_steps(path, text, cursor, should_stop)

    def top_steps(self, path: str, text: str, should_stop=None, lead: tuple[int, ...] | None = None):
        """A file opened before any cursor is known: compute the head that every plan on the file's first
        window starts with: the markers, then the file from its top, as far as a prefix reaches there
        (three quarters of a slot's room; a smaller file: all of it). The first request anywhere in that
        window then finds its prefix up to the cursor's line cached, less the lines typed since. (A plan
        at the file's end, as before, spent its first budget on the file's last lines, and a file bigger
        than a slot had its last window computed: of no use to a cursor near the top.) ``lead``: the
        repository context the file's plans will start with (repoctx.py), else the session's."""
        engine = self.engine
        planner = engine.planner_with(lead) if lead is not None else engine.planner_for(engine.session(path))
        space = planner.space(engine.config.max_tokens)
        prefix = planner.tokenize(text[:text_end(text, 0, planner.text_span(engine.config.max_tokens))])
        prefix = prefix[:space * 3 // 4]
        if prefix:
            ro = RunOptions(path=path, should_stop=should_stop, chunk=self.idle_chunk, idle=True, job="warm")
            yield engine.runner.run_steps(planner.head_tokens(tuple(prefix)), Options(max_tokens=0), ro)

    def calibrate_steps(self, should_stop=None, n: int = 64):
        """Measure prefill speed (for the latency budget) over ``4 * n`` tokens in chunks of ``n``, at
        growing context sizes (one pass: every prefill after it refines the speed), and build the token
        healer's index (steps).

        Uses an empty slot (none: the requests so far have measured it) and leaves it empty; it is not a
        request, so nothing is counted or saved. A remote-only engine has neither (no decoder: the
        budget's speed is the replicas', which ``remote_steps`` learns)."""
        engine = self.engine
        if engine.decoder is None:
            return
        if engine.default_heal:
            engine.decoder.healer  # noqa: B018 - built now, not on the first keystroke (it reads the vocabulary)
        slot = next((s for s in engine.slots.free() if not len(s.tokens)), None)
        if engine.speed.known or slot is None:
            return
        tokens = np.resize(np.asarray(engine.model.tokenize(PROBE), dtype=np.int32), 4 * n)
        owner = slot.start("calibrate", "prefill")
        try:  # chunks of a growing context: the decoder observes each (a per-token and a context cost)
            yield from engine.decoder.prefill_steps(slot, tokens, 0, should_stop, n)
        finally:
            slot.end(owner)
            engine.reuse.clear(slot)

    def idle_chunk(self, n_ctx: int) -> int:
        """Tokens per idle prefill chunk at ``n_ctx`` tokens of context: what prefills in about
        ``idle_chunk_ms`` on this machine now, within [8, idle_chunk_tokens]; more where a bigger batch
        is safe, since it prefills more tokens a second (0.5B shape at 1,000 tokens of context: 122
        tokens/s in batches of 8, 149 in 16, 180 in 32, 192 in 64, llama_decode alone):
        - right after a keystroke, what ends before the next request can come (the editor's debounce,
          ``engine.pace``; ``policy.window_share`` of it): while someone types, keys come every ~200 ms;
        - in a quiet spell, half the quiet so far (``policy.quiet_share``): a request that comes stops it
          anyway (``Engine.interrupt``).
        Notes ``patience_s``: the time of a chunk of the usual size."""
        engine = self.engine
        cap = engine.config.idle_chunk_tokens
        if not engine.speed.known:
            return cap
        base_ms = engine.config.idle_chunk_ms
        base = max(8, min(cap, engine.speed.max_new(base_ms, n_ctx)))
        self.patience_s = engine.speed.predict_ms(base, n_ctx) / 1e3
        policy = engine.policy
        now = policy.clock()
        window_ms = engine.pace.window_s(now) * 1e3
        if window_ms > 0:  # no request before the editor's debounce ends: a batch that ends by then
            # (never smaller than the usual chunk: on a slow model tiny batches waste more than a stopped one)
            return self.at_least(base, window_ms * policy.window_share, n_ctx)
        return self.at_least(base, (now - engine.active_at) * 1e3 * policy.quiet_share, n_ctx)

    def riding_s(self) -> float:
        """How long growth riding along a request may run at once: ``idle_chunk_ms``, or most of the
        editor's debounce once it is known (``engine.pace``): the answer it rides along is cancelled by
        the next keystroke, and the request that keystroke sends comes only after the debounce (in the
        daemon a request or a call that comes sooner stops the batch: ``Scheduler._step``)."""
        engine = self.engine
        return max(engine.config.idle_chunk_ms / 1e3, engine.pace.debounce_s * engine.policy.window_share)

    def riding_chunk(self, n_ctx: int) -> int:
        """Tokens per chunk of growth riding along a request: what prefills in :meth:`riding_s`."""
        return self.at_least(self.idle_chunk(n_ctx), self.riding_s() * 1e3, n_ctx)

    def at_least(self, base: int, ms: float, n_ctx: int) -> int:
        """``base`` tokens, or more: what prefills in ``ms`` after ``n_ctx`` (at most ``idle_chunk_tokens``)."""
        engine = self.engine
        if not engine.speed.known:
            return base
        return max(base, min(engine.config.idle_chunk_tokens, engine.speed.max_new(ms, n_ctx)))


class Alongside:
    """Growth riding along one request's generation, for a request whose plan the budget reduced.

    After each generated token, once some text went out, ``step()`` may grow the plan by one chunk
    (another slot: the answer is unchanged), spending ``grow_share`` of the time, until
    ``grow_window_ms`` after the request came. While someone types, the next keystroke most likely
    comes within the window and supersedes the completion; past it they are waiting for it, at full
    speed. ``yield_to()`` says other work waits: growth does not run then. The growth is one job, planned
    once for the request, a step of it chunks for up to ``Growth.riding_s``; whoever steps it closes
    it (``close``) when other work comes between two of the request's tokens (it would pick or change
    the slot growth is in) and when the request ends."""

    def __init__(self, engine, path: str | None, t0: float, should_stop=None, yield_to=None):
        self.engine, self.path, self.should_stop, self.yield_to = engine, path, should_stop, yield_to
        self.growth = engine.growth
        self.clock = engine.policy.clock  # (``t0`` is of this clock)
        cfg = engine.config
        self.share, self.window = cfg.grow_share, t0 + cfg.grow_window_ms / 1e3
        self.on = self.share > 0 and len(engine.slots.slots) >= 2
        self.next_at = 0.0
        self.steps = None  # the growth begun, between two of its chunks

    def step(self) -> None:
        """Growth chunks for up to ``riding_s``, if due (the engine thread, between two of the request's steps)."""
        t = self.clock()
        if not self.on or t < self.next_at or t >= self.window or (self.yield_to is not None and self.yield_to()):
            return
        if self.steps is None:
            if not self.engine.slots.free() or not self.growth.reduced(self.path):
                return  # (no slot without a request in it: nowhere to grow)
            self.steps = Steps(self.growth.grow_steps(self.path, self.stop, light=True))
        deadline = t + self.growth.riding_s()
        try:
            while self.clock() < deadline and not self.stop():
                next(self.steps)
        except (StopIteration, Cancelled):
            self.steps = None  # grown (or stopped: the request ends)
        except Exception:  # noqa: BLE001 - optional work never fails the request
            log.exception("growth during generation failed")
            self.on, self.steps = False, None
            return
        done = self.clock()
        self.next_at = done + (done - t) * (1 - self.share) / self.share

    def stop(self) -> bool:
        """Whether the growth stops: the request ends, or other work waits."""
        return (self.should_stop is not None and self.should_stop()) or (self.yield_to is not None and self.yield_to())

    def close(self) -> None:
        """End the growth begun (what it computed stays in its slot; the next request's goes on from there)."""
        steps, self.steps = self.steps, None
        if steps is not None:
            try:
                steps.throw(Cancelled())
            except (Cancelled, StopIteration):
                pass


def drive_riding(steps, ride: Alongside):
    """Run a request's steps to the end, growing alongside after each token that showed text."""
    steps = Steps(steps)
    try:
        while True:
            try:
                kind = next(steps)
            except StopIteration as done:
                return done.value
            if kind == SHOWN:
                ride.step()
    finally:
        ride.close()


TaskFn = Callable  # (engine, should_stop) -> a generator of steps, or None when done at once
