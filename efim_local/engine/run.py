"""A request as steps: plan it, fit it to the budget, find where its KV starts, prefill, generate.

Each ``*_steps`` method of the engine's :class:`Runner` is a generator of steps (``decode.PREFILL``,
``TOKEN``, ``SHOWN``) that returns its result: the scheduler (``scheduler.py``) decides which work
takes the next step; ``steps.drive()`` runs one to its end (the library API, tests). A job runs another's
steps by yielding it (``out = yield self.run_steps(...)``: ``steps.Steps``), not nested in it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import Cancelled, InvalidParams
from ..llama import SamplerParams
from ..prompt.healing import MAX_BACKOFF
from ..prompt.planner import GROWN, Budget, Plan
from ..request import CompletionRequest, Options, Position
from .completion import Completion, Prompt, Timings, TokenCounts
from .decode import GenSpec
from .instant import Instant, Shown, Through, cached_completion, keep_known
from .policy import Policy
from .reduction import reduced_by
from .stream import StopRules

log = logging.getLogger("efim.engine")


@dataclass(frozen=True)
class RunOptions:
    """How a token prompt is run, beyond the request's options.

    ``cold`` ignores all cached KV; ``idle`` work leaves the KV of the requests' slots whole (it
    grows a copy); ``light`` work (growth between a request's tokens) never saves or restores a
    state (see Reuse.start). ``checkpoint`` is the prompt length worth saving for sliding-window
    models. ``should_stop()`` is polled between batches (of at most ``chunk`` tokens) and tokens;
    when true, Cancelled is raised. ``heal`` is text backed off the prompt that the first tokens must
    spell out again; ``closers``: auto-paired closers after the cursor, where the answer stops."""

    path: str | None = None
    cold: bool = False
    idle: bool = False
    light: bool = False
    checkpoint: int | None = None
    heal: bytes = b""
    closers: str = ""
    chunk: int | Callable[[int], int] | None = None
    should_stop: Callable[[], bool] | None = None
    on_text: Callable[[str], None] | None = None
    t0: float | None = None
    known: Sequence[int] | None = None  # type-through: the greedy continuation known (engine/instant.py)
    trail: list[int] | None = None  # receives the greedy continuation (GenSpec.trail)
    keep: Sequence[int] | None = None  # idle work: KV of these tokens that it never cuts (Reuse.start)
    # The slot's job while it runs (slots.Slot; None: "idle" or "request", by ``idle``); "keystroke": a
    # request begun at its keystroke, before the editor asks (Runner.keystroke_steps)
    job: str | None = None


class Runner:
    """An engine's requests as steps (the module's docstring): a token prompt run in the best slot,
    a request planned within its latency budget (taking what growth computed) and completed. Its
    engine builds it and owns it (``engine.runner``)."""

    def __init__(self, engine):
        self.engine = engine

    def run_steps(self, tokens, how: Options, ro: RunOptions = RunOptions()):
        """Decode a token prompt in the best slot and generate (steps; returns a Completion)."""
        engine = self.engine
        t0 = ro.t0 if ro.t0 is not None else time.perf_counter()
        prompt = np.asarray(tokens, dtype=np.int32)
        if len(prompt) == 0:
            raise InvalidParams("invalid params: the prompt is empty")
        want_sparse = how.sparse if how.sparse is not None else engine.config.sparse_budget > 0
        max_tokens = engine.max_tokens(how)
        room = engine.config.context.n_ctx_seq - len(prompt)
        rules = StopRules(max_tokens=min(max_tokens, room), stop_at_newline=how.stop_at_newline,
                          max_lines=how.max_lines, stop_strings=engine.template.stop_strings, closers=ro.closers,
                          type_over=how.type_over)
        out = yield engine.backend.run_steps(prompt, how, ro, rules)  # replicas first (backends.py)
        if out is not None:
            return out  # else it runs here: no replicas, a cold run, or every replica failed
        keep = None if ro.keep is None else np.asarray(ro.keep, dtype=np.int32)
        start = engine.reuse.start(prompt, ro.path, want_sparse, ro.cold, ro.idle, ro.light, keep)
        slot = start.slot
        # (a request's, a keystroke's: other work between its steps never picks, evicts or empties the slot)
        owner = slot.start(ro.job or ("idle" if ro.idle else "request"), "prefill")
        counts = TokenCounts(prompt=len(prompt))
        known = ro.known or ()
        try:
            ready = not (ro.known is not None and not ro.cold and keep_known(engine.ctx, slot, prompt, known))
            if rules.max_tokens <= 0 and not ro.cold and start.n_common >= len(prompt):
                ready = False  # idle work on a prompt the slot holds: nothing to do (what follows it stays)
            evaluated, kept = 0, None
            if ready and not ro.cold and ro.known is None and start.n_common >= len(prompt) and how.temperature <= 0:
                kept = engine.decoder.kept_logits(slot, prompt)  # a keystroke mid-word: the last one's prompt
                ready = kept is None
            if ready:  # (else the slot holds the prompt, and the known continuation's KV as far as it goes)
                evaluated = yield from engine.decoder.prefill_steps(slot, prompt, start.n_common, ro.should_stop,
                                                                    ro.chunk)
            counts.cached, counts.evaluated = len(prompt) - evaluated, evaluated
            spec = GenSpec(rules, ro.on_text, how.ignore_eog, ro.should_stop, ro.heal, known, ro.trail)
            slot.phase = "generate"
            with engine.decoder.sampler(SamplerParams(how.temperature, how.top_k, how.top_p, how.seed)) as sampler:
                gen = yield from engine.decoder.generate_steps(slot, prompt, sampler, spec, ready, kept)
        except Cancelled as e:
            if isinstance(e.data, dict) and "first_token_at" in e.data:  # cancelled while generating
                counts.generated = e.data["generated"]
                e.data = {"tokens": asdict(counts), "timings": {"prompt_ms": (e.data["first_token_at"] - t0) * 1e3}}
            raise
        finally:
            log.debug("run %s%s: slot %d from %d (%s) of %d, now %d", "idle " if ro.idle else "", ro.path, slot.seq,
                      start.n_common, start.tier, len(prompt), len(slot.tokens))
            slot.end(owner)
            engine.reuse.finish(start, ro.path, len(prompt), ro.checkpoint, ro.cold, ro.idle)
        t2 = time.perf_counter()
        reason = gen.reason
        if reason == "max_tokens" and room < max_tokens:
            reason = "context_full"
        counts.generated = len(gen.ids)
        first = gen.t_first or t2
        # A short reuse (under the slot manager's min_reuse) still came from the slot.
        tier = ("slot" if start.tier == "none" else start.tier) if counts.cached else "none"
        return Completion(
            text=gen.stream.text, stop_reason=reason, layout="tokens", tokens=counts,
            timings=Timings(prompt_ms=(first - t0) * 1e3, predict_ms=(t2 - first) * 1e3, total_ms=(t2 - t0) * 1e3),
            slot=slot.seq, cache_tier=tier, sparse=start.sparse, token_ids=gen.ids,
            replaces=rules.replaced(gen.stream.text), prompt=Prompt(tuple(prompt.tolist()), ro.heal, ro.closers))

    def complete_steps(self, req: CompletionRequest, ro: RunOptions = RunOptions()):
        """A request's steps (a generator; returns a Completion that reports the context it used): a
        keystroke that types on its file's last answer is answered from that answer's trail
        (``through_steps``), any other is planned and run (``planned_steps``). Returned, not
        delegated to: generators nest no deeper than the run's own."""
        t0 = time.perf_counter()
        through = self.engine.instant.match(req) if self.engine.instant is not None and not ro.idle else None
        return self.through_steps(req, through, ro, t0) if through is not None else self.planned_steps(req, ro, t0)

    def planned_steps(self, req: CompletionRequest, ro: RunOptions, t0: float):
        """Plan a request (within its latency budget), heal its partial word, run it (steps; returns a
        Completion). A plan answered before is answered from the cache (``instant.py``; idle work is
        not)."""
        engine = self.engine
        instant = None if ro.idle else engine.instant
        plan = self.fit_budget(req, engine.plan(req))
        engine.files.set_typed(req.path, plan.middle_tokens)
        tokens, heal = plan.tokens, b""
        want_heal = (engine.default_heal if req.how.heal is None else req.how.heal) and engine.backend.heals
        if want_heal and plan.middle_tokens:
            # Back off the typed tokens that could merge with what follows; generation spells them again.
            tail = [engine.model.piece(t) for t in plan.middle_tokens[-MAX_BACKOFF:]]
            k = engine.healer.backoff(tail, word_end=engine.fragment_trained)
            cut = plan.middle_start + len(plan.middle_tokens) - k
            heal = b"".join(tail[len(tail) - k:])
            tokens = tokens[:cut] + tokens[cut + k:]
        plan_ms = (time.perf_counter() - t0) * 1e3
        context = context_report(plan)
        if plan.reduced:  # why, and the facts that made the budget bind (reduction.py)
            context["reduced_by"] = reduced_by(engine.speed, engine.cores, self.budget_ms(req.how), context)
        if not ro.idle:
            engine.note_context(context["tokens"], context["full_tokens"])
        if engine.repo is not None:  # the repository context before the prefix: tokens per tier (repoctx.py)
            context["repo"] = engine.repo.report(req.path)
        if plan.closers:
            context["closers"] = plan.closers
        prompt, shown = Prompt(tuple(tokens), heal, plan.closers), None
        if instant is not None:
            key = instant.key(prompt, req.how, engine.max_tokens(req.how))
            hit = instant.get(key, prompt)
            if hit is not None:
                out = cached_completion(hit, prompt)
                if greedy(req.how) and plan.layout == "efim":
                    instant.remember(req.path, Shown(req.text, req.cursor, np.asarray(tokens, dtype=np.int32), heal,
                                                     plan.closers, list(hit[3]), out.text, len(out.token_ids),
                                                     engine.max_tokens(req.how), plan.middle_start, dict(context),
                                                     keystroke=ro.job == "keystroke"))
                out.timings = Timings(plan_ms=plan_ms, total_ms=(time.perf_counter() - t0) * 1e3)
                out.reanchor = plan.reanchor
                if ro.on_text is not None and out.text:  # streamed like any answer, at once
                    ro.on_text(out.text)
                return out
            if greedy(req.how) and plan.layout == "efim":  # the middle comes last: typing extends the prompt
                shown = instant.remember(req.path, Shown(req.text, req.cursor, np.asarray(tokens, dtype=np.int32), heal,
                                                         plan.closers, max_tokens=engine.max_tokens(req.how),
                                                         checkpoint=plan.middle_start, context=dict(context),
                                                         keystroke=ro.job == "keystroke"))
        ro = RunOptions(path=req.path, t0=t0, checkpoint=plan.middle_start, heal=heal, closers=plan.closers,
                        idle=ro.idle, job=ro.job, chunk=ro.chunk, should_stop=ro.should_stop, on_text=ro.on_text,
                        trail=shown.ids if shown is not None else None)
        try:
            out = yield self.run_steps(tokens, req.how, ro)
        except Cancelled as e:
            # Say what it planned (benchmarks score it), and how far it got if it was generating.
            e.data = {**(e.data if isinstance(e.data, dict) else {}), "context": context, "reanchor": plan.reanchor}
            raise
        out.timings.plan_ms = plan_ms
        out.layout = plan.layout
        out.reanchor = plan.reanchor
        if plan.prefix_trimmed or plan.suffix_trimmed or any(plan.cut):
            out.trimmed = {"prefix_tokens": plan.prefix_trimmed, "suffix_tokens": plan.suffix_trimmed}
            if any(plan.cut):  # a big file: text that was not even tokenized
                out.trimmed |= {"prefix_chars": plan.cut[0], "suffix_chars": plan.cut[1]}
        out.context = context
        if shown is not None:
            Instant.answered(shown, out)
        if instant is not None and not (out.sparse and "fallback" not in out.sparse):  # approximate KV: not kept
            instant.put(key, prompt, out, shown.ids if shown is not None else out.token_ids)
        return out

    def through_steps(self, req: CompletionRequest, th: Through, ro: RunOptions, t0: float):
        """Answer a keystroke that types on the last answer (``instant.py``): its plan is that answer's
        prompt plus the tokens typed, and the rest of its trail is known (steps; returns a Completion)."""
        engine = self.engine
        s = th.shown
        engine.files.note_request(req.path, req.text, req.cursor)
        new = engine.instant.remember(req.path, Shown(req.text, req.cursor, th.tokens, th.heal, th.closers,
                                                      list(th.known), max_tokens=engine.max_tokens(req.how),
                                                      checkpoint=s.checkpoint, context=dict(s.context)))
        out = yield self.run_steps(th.tokens, req.how, RunOptions(
            path=req.path, t0=t0, checkpoint=s.checkpoint, heal=th.heal, closers=th.closers, chunk=ro.chunk,
            should_stop=ro.should_stop, on_text=ro.on_text, known=th.known, trail=new.ids))
        out.source, out.layout, out.context = th.source, "efim", dict(s.context)
        Instant.answered(new, out)
        return out

    def keystroke_steps(self, path: str, version: int, how: Options, should_stop):
        """Answer at a keystroke, before the editor's debounce has passed (background steps): the
        request that comes then, on this text and caret, takes the answer so far from the file's trail
        (``Instant.match``, source "keystroke"), its first tokens already generated. Nothing when the
        document moved on, or the keystroke typed on what the trail knows (then it extends the trail).
        ``how``: the options of the file's last request."""
        engine = self.engine
        if engine.instant is None:
            return None
        with engine.files.lock:
            f = engine.files.get(path)
            if f is None or not f.open or f.version != version or f.caret is None or f.caret > len(f.text):
                return None
            req = CompletionRequest.of(Position(f.text, f.caret, path), how)
        through = engine.instant.match(req)
        if through is not None:  # the lead past what is typed, not past the trail's end: each key would add it
            typed = len(through.shown.ids) - len(through.known)
            return engine.trail.ahead_steps(path, should_stop, engine.policy.ahead_cancelled, typed)
        limit = engine.policy.keystroke_tokens

        def stop() -> bool:  # the next keystroke (its own answer starts), or enough for the request to take
            s = engine.instant.shown.get(path)
            return should_stop() or f.version != version or (s is not None and s.keystroke and len(s.ids) >= limit)

        return self.planned_steps(req, RunOptions(should_stop=stop, job="keystroke"), time.perf_counter())

    def probe_speed(self, n: int = 16, warm: int = 4) -> None:
        """A first guess of the prefill speed, for a budget asked before anything was learned (a fresh
        in-process engine, or a request before the daemon's calibration): ``n`` tokens prefilled in an
        empty slot after ``warm`` that are not timed (a context's first decode allocates its buffers),
        then the slot is emptied again. Costs about ``n + warm`` tokens' time, once."""
        engine = self.engine
        slot = next((s for s in engine.slots.free() if not len(s.tokens)), None)
        if slot is None:
            return
        tokens = np.resize(np.asarray(engine.model.tokenize(PROBE), dtype=np.int32), warm + n)
        try:  # the speed learns from batches of at least 8 tokens (Policy.speed_min_tokens): the warm-up is not one
            engine.decoder.prefill(slot, tokens, 0, chunk=lambda pos: warm if pos == 0 else n)
        finally:
            engine.reuse.clear(slot)

    def adopt_growth(self, req: CompletionRequest, plan: Plan, budget: float, peek) -> Plan | None:
        """A reduced plan on a kept anchor, refitted to what growth has computed since: once growth has
        the window's whole prefix, the plan takes it and the start of the suffix that growth has too
        (the same anchor: the typed middle stays cheap; growth stages such plans, ``background.py``).
        Taken when it adds enough context (``policy.adopt_min`` tokens, ``1/policy.adopt_gain`` of the full
        plan's) within ``policy.adopt_share`` of the budget, so the context grows while the user types
        instead of in one jump at the end."""
        engine = self.engine
        if not plan.reduced or plan.reanchor is not None:
            return None
        session = engine.session(req.path)
        planner, anchor = engine.planner_for(session), session.anchor
        policy = engine.policy
        used = len(plan.prefix_tokens) + len(plan.suffix_tokens)
        want = max(policy.adopt_min, plan.full_context // policy.adopt_gain)
        # A plan that lacks lines of its prefix (the cached head, then the lines nearest the cursor) takes
        # any grown plan that has them all: those lines weigh most (docs/benchmarks-context.md).
        lacks = len(plan.prefix_tokens) < len(anchor.full_prefix) - anchor.window - anchor.base
        if plan.full_context - used < want and not lacks:
            return None
        full = planner.full_anchor(anchor, engine.max_tokens(req.how))
        # All that growth holds, else the last stage it left with the typed text after it (cheaper)
        for cap in (None, *reversed(stage_ends(planner, full, policy, len(anchor.suffix_tokens)))):
            held = peek if cap is None else (lambda toks, cap=cap: min(peek(toks), cap))
            fitted = planner.refit(anchor, len(plan.middle_tokens), Budget(tokens=0, cached=held, floor=0),
                                   reserve=engine.max_tokens(req.how))
            gain = len(fitted.prefix_tokens) + len(fitted.suffix_tokens) - used
            if fitted.reduced and (fitted.head < len(anchor.full_prefix) - fitted.window - fitted.base  # a gap
                                   or gain <= 0 or (gain < want and not lacks)):
                continue
            grown = planner.plan_on(fitted, plan.layout, plan.middle_tokens, plan.middle_text, GROWN, plan.closers)
            have = peek(grown.tokens)
            if engine.speed.predict_ms(len(grown.tokens) - have, have) <= budget * policy.adopt_share:
                break
        else:
            return None
        engine.files.set_anchor(req.path, fitted)
        if not fitted.reduced:  # growth is over: the slots of the reduced plans are stale copies
            stable = grown.tokens[:grown.middle_start]
            engine.reuse.drop_others(req.path, np.asarray(stable[:peek(stable)], dtype=np.int32))
        return grown

    def budget_ms(self, how: Options) -> float:
        """A request's latency budget for its prompt, in ms (0: none)."""
        engine = self.engine
        return how.max_prompt_ms if how.max_prompt_ms is not None else engine.config.max_prompt_ms

    def fit_budget(self, req: CompletionRequest, plan: Plan) -> Plan:
        """``plan``, or a reduced one if its new tokens would not be prefilled within the request's
        budget. Cached tokens are free: a reduced plan keeps the head of the prefix that a slot already
        holds (idle growth computes it from the file's top), then spends the budget on the context
        nearest the cursor. A reduced plan stays until growth has computed the full one: a re-plan on a
        partly grown head would cost up to the budget, and take (and cut) the slot the growth is in."""
        engine = self.engine
        budget = self.budget_ms(req.how)
        speed = engine.speed
        if budget > 0 and not speed.known:
            self.probe_speed()
            engine.size_near()  # (Engine.plan sizes it when the speed is known already)
        if budget <= 0 or not speed.known:
            return plan
        peek = lambda toks: engine.backend.peek(np.asarray(toks, np.int32))
        have = peek(plan.tokens)
        if speed.predict_ms(len(plan.tokens) - have, have) <= budget:
            return self.adopt_growth(req, plan, budget, peek) or plan
        # A saved state restores in milliseconds: what it holds counts as cached (the first request after a
        # restart, a file reopened, an earlier version of it: reuse.start restores it).
        stored = engine.backend.stored(np.asarray(plan.tokens, np.int32), req.path)  # (replicas: None)
        if stored is not None:
            peek = lambda toks: stored(np.asarray(toks, np.int32))
            have = peek(plan.tokens)
            if speed.predict_ms(len(plan.tokens) - have, have) <= budget:
                return self.adopt_growth(req, plan, budget, peek) or plan
        session = engine.session(req.path)
        anchor = session.anchor
        log.debug("%s: plan over budget (reanchor=%s, %d of %d tokens cached)", req.path, plan.reanchor, have,
                  len(plan.tokens))
        # The anchor holds its pieces' untrimmed tokens: a budgeted re-anchor at the same cursor line never
        # tokenizes the file again.
        planner = engine.planner_for(session)  # with the file's repository context (repoctx.py)
        same = plan.reanchor is not None and anchor.offset == planner.anchor_offset(req.text, req.cursor)
        return planner.plan(session, req.text, req.cursor, req.how.layout, reserve=engine.max_tokens(req.how),
                            budget=Budget(cached=peek, new_for=lambda n_cached: speed.max_new(budget, n_cached)),
                            pieces=(anchor.full_prefix, anchor.full_suffix) if same else None)


def greedy(how: Options) -> bool:
    """Whether a request's answer is the greedy continuation (a function of its prompt alone)."""
    return how.temperature <= 0 and not how.ignore_eog


PROBE = "def f(x):\n    return x + 1\n" * 2


def context_report(plan: Plan) -> dict:
    """The context a plan gives the model: prefix and suffix tokens, their sum, the sum without a
    latency budget, the share of it used, and whether the budget reduced it."""
    used = len(plan.prefix_tokens) + len(plan.suffix_tokens)
    full = max(plan.full_context, used)
    return {"prefix_tokens": len(plan.prefix_tokens), "suffix_tokens": len(plan.suffix_tokens),
            "middle_tokens": len(plan.middle_tokens), "head_tokens": plan.head, "gap_tokens": plan.gap, "tokens": used,
            "full_tokens": full, "share": round(used / full, 3) if full else 1.0, "reduced": plan.reduced}


def stage_ends(planner, full, policy: Policy, first: int = 0) -> list[int]:
    """Where growth's stages end in the full plan's tokens (EFIM, PSM order; else none): the whole
    prefix and the ``first`` tokens of the suffix (a reduced plan's: so that one lacking lines of its
    prefix gets them as soon as they are computed), then every ``1/stages`` of the context into the
    suffix (``policy.stages``, at least ``policy.stage_min`` tokens each)."""
    m = planner.markers
    if m.order != "psm":
        return []
    body = len(planner.head_tokens(full.prefix_tokens)) + len(m.suf)  # where the suffix starts
    step = max(policy.stage_min, full.full_context // policy.stages)
    rest = list(range(body + step, body + len(full.suffix_tokens) - step // 2, step))
    return ([body + first] if 0 < first < min(step // 2, len(full.suffix_tokens)) else []) + rest
