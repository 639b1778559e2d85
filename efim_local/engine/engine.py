"""The completion engine: one model, one context, several slots, EFIM plans.

The data path of a request: plan it (``prompt/``), find where its KV starts
(``reuse.py``: live slot, saved state, sparse restore), decode the rest and
sample (``decode.py``), keep the prompt's KV for the next keystroke.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import Cancelled
from ..errors import InvalidParams
from ..kv import StateStore, StoreConfig
from ..kv.fingerprint import layout_key, layout_params
from ..llama import Batch, Context, Model, Sampler, SamplerParams
from ..llama._lib import library_info
from ..prompt import templates
from ..prompt.healing import Healer
from ..prompt.planner import FileSession, Plan, Planner, PlannerLimits, line_start
from .cpu import FreeCores
from .decode import Decoder
from . import interrupt
from .files import Files
from .models import KIND_FRAGMENT, choose_heal, choose_layout, model_kind
from .request import Completion, CompletionRequest, Timings, TokenCounts
from .reuse import Reuse
from .slots import SlotManager
from .speed import PrefillSpeed
from .stream import StopRules


log = logging.getLogger("efim.engine")


def make_planner(model: Model, config: Config) -> tuple[templates.Template, Planner]:
    """The FIM template and the planner a config gives for ``model`` (as the engine plans)."""
    template = templates.resolve(
        model, family=config.fim_family,
        text=templates.parse_text_template(config.fim_template) if config.fim_template else None,
        order=config.fim_order)
    planner = Planner(model.tokenize, template.markers, PlannerLimits(
        n_ctx=config.context.n_ctx_seq, max_middle_tokens=config.max_middle_tokens,
        reserve_tokens=config.max_tokens))
    return template, planner


class Engine:
    """Owns the llama.cpp model and context. Not thread-safe: one thread drives it.

    Use it as a context manager; ``close()`` saves dirty slots, then frees everything in
    reverse order of creation."""

    def __init__(self, config: Config, model_path: str | Path, store: StoreConfig | None = None):
        self.config = config
        with ExitStack() as stack:
            self.model = stack.enter_context(
                Model(model_path, n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu))
            stack.callback(interrupt.drain)  # a tokenize call idle work left running reads the model
            self.template, self.planner = make_planner(self.model, config)
            self.sparse = None
            if config.sparse_budget > 0:
                from ..kv.sparse.select import SelectConfig
                from ..kv.sparse.sparse import SparseMode

                self.sparse = SparseMode(self.model, Path(model_path), SelectConfig(
                    budget=config.sparse_budget, alpha=config.sparse_alpha), config.sparse_min_tokens)
            # Only a context that restores states needs the (slower) eval callback.
            cb = self.sparse.eval_callback if self.sparse and store is not None else None
            self.ctx = stack.enter_context(Context(self.model, config.context, cb))
            self.batch = stack.enter_context(Batch(self.ctx.n_batch, config.context.n_slots))
            self.slots = SlotManager(config.context.n_slots)
            self.files = Files()
            # Sliding-window caches keep only the window when serialized: restore whole states only.
            self.swa = self.model.n_swa > 0
            self.swa_strategy = ("swa_full" if config.context.swa_full else "recompute") if self.swa else "none"
            self.n_stream = 1 if config.context.kv_unified else config.context.n_slots
            self.store = None
            if store is not None:
                import llama_cpp

                params = layout_params(config.context, llama_cpp.__version__)
                # A store that cannot be used (full disk, not a directory) is None, with one warning.
                self.store = StateStore.open(store, model_path, layout_key(params), params, whole_state_only=self.swa)
                if self.store is not None:
                    stack.enter_context(self.store)
                if self.store is not None and self.sparse is not None:
                    self.sparse.attach(self.ctx, self.batch, self.n_stream, self.model.n_swa)
                    if self.sparse.skew is not None:
                        frac = store.shrink_to
                        self.store.shrink = lambda payload, partial, sel: self.sparse.shrink(
                            payload, partial, sel, frac)
            self.decoder = Decoder(self.model, self.ctx, self.batch, self.slots, self.template.stop_tokens,
                                   observe=lambda n, c, ms: self.speed.observe(n, c, ms))
            self.reuse = Reuse(self.ctx, self.slots, self.decoder, self.files, self.store, self.sparse,
                               self.n_stream, self.swa)
            self.fragment_trained = model_kind(self.model.meta) == KIND_FRAGMENT
            text_markers = self.template.source == "text"
            self.default_layout, self.layout_reason = choose_layout(self.model.meta, config.layout, text_markers)
            self.default_heal, self.heal_reason = choose_heal(self.model.meta, text_markers, config.heal)
            self.speed = PrefillSpeed()  # learned from every prefill; the latency budget asks it
            cp = config.context
            # Automatic threads; not with flash attention, whose single-token split over the KV follows
            # the thread count (the answer must not depend on the machine's load).
            auto = not (cp.n_threads and cp.n_threads_batch) and not cp.flash_attn
            self.cores = FreeCores() if auto else None
            if self.store is not None:  # last in, first out: saves run before the store closes
                stack.callback(self._save_all)
            self._stack = stack.pop_all()

    # -- lifetime -------------------------------------------------------------------------
    def _save_all(self) -> None:
        self.reuse.flush()
        self.store.spill()

    def close(self) -> None:
        """Save dirty slots to disk, then free llama.cpp objects (idempotent)."""
        stack, self._stack = getattr(self, "_stack", None), None
        if stack is not None:
            stack.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------
    def session(self, path: str) -> FileSession:
        """The planning session (anchor, layout) of a file, created if new."""
        f = self.files.entry(path)
        if f.session is None:
            f.session = FileSession(layout=self.default_layout)
        return f.session

    def plan(self, req: CompletionRequest) -> Plan:
        """The token plan for a request (and the file's new anchor, if it moved)."""
        plan = self.planner.plan(self.session(req.path), req.text, req.cursor, req.layout,
                                 reserve=self._max_tokens(req))
        f = self.files.entry(req.path)
        f.cursor = req.cursor
        if not f.open:  # an open document's text is the editor's to change
            f.text = req.text
        return plan

    def _max_tokens(self, req: CompletionRequest) -> int:
        return req.max_tokens if req.max_tokens is not None else self.config.max_tokens

    def budget_ms(self, req: CompletionRequest) -> float:
        """The request's latency budget for its prompt, in ms (0: none)."""
        return req.max_prompt_ms if req.max_prompt_ms is not None else self.config.max_prompt_ms

    def _fit_budget(self, req: CompletionRequest, plan: Plan) -> Plan:
        """``plan``, or a reduced one if its new tokens would not be prefilled within the request's
        budget. Cached tokens are free: a reduced plan keeps the head of the prefix that a slot
        already holds (idle growth computes it from the file's top), then spends the budget on the
        context nearest the cursor. A reduced plan stays until growth has computed the full one: a
        re-plan on a partly grown head would cost up to the budget, and take (and cut) the slot the
        growth is in."""
        budget = self.budget_ms(req)
        if budget <= 0 or not self.speed.known:
            return plan
        peek = lambda toks: self.reuse.peek(np.asarray(toks, dtype=np.int32))
        have = peek(plan.tokens)
        over = self.speed.predict_ms(len(plan.tokens) - have, have) > budget
        if not over:
            return plan
        anchor = self.session(req.path).anchor
        log.debug("%s: plan over budget (reanchor=%s, %d of %d tokens cached)", req.path, plan.reanchor, have,
                  len(plan.tokens))
        # The anchor holds its pieces' untrimmed tokens: a budgeted re-anchor at the same cursor line
        # never tokenizes the file again.
        same = plan.reanchor is not None and anchor.offset == line_start(req.text, req.cursor)
        return self.planner.plan(self.session(req.path), req.text, req.cursor, req.layout,
                                 reserve=self._max_tokens(req), cached=peek,
                                 budget_for=lambda n_cached: self.speed.max_new(budget, n_cached),
                                 pieces=(anchor.full_prefix, anchor.full_suffix) if same else None)

    def complete(self, req: CompletionRequest, on_text=None, should_stop=None, chunk=None,
                 idle: bool = False, yield_to=None) -> Completion:
        """Plan and complete a request. ``on_text`` receives streamed text; see run() for ``should_stop``,
        ``chunk``, ``idle`` and ``yield_to``."""
        t0 = time.perf_counter()
        plan = self._fit_budget(req, self.plan(req))
        self.session(req.path).typed = plan.middle_tokens
        tokens, heal = plan.tokens, b""
        want_heal = self.default_heal if req.heal is None else req.heal
        if want_heal and plan.middle_tokens and Healer.should_heal(self.model.piece(plan.middle_tokens[-1])):
            # Back off the middle's last token; generation must spell it out again.
            cut = plan.middle_start + len(plan.middle_tokens) - 1
            heal = self.model.piece(tokens[cut])
            tokens = tokens[:cut] + tokens[cut + 1:]
        plan_ms = (time.perf_counter() - t0) * 1e3
        context = {"prefix_tokens": len(plan.prefix_tokens), "suffix_tokens": len(plan.suffix_tokens),
                   "middle_tokens": len(plan.middle_tokens), "reduced": plan.reduced,
                   "head_tokens": self.session(req.path).anchor.head}  # of the prefix: the file's top, kept
        if plan.closers:
            context["closers"] = plan.closers
        try:
            out = self.run(tokens, req, path=req.path, t0=t0, checkpoint=plan.middle_start,
                           on_text=on_text, should_stop=should_stop, heal=heal, chunk=chunk, idle=idle,
                           closers=plan.closers, yield_to=yield_to)
        except Cancelled as e:
            # Say what it planned (benchmarks score it), and how far it got if it was generating.
            e.data = {**(e.data if isinstance(e.data, dict) else {}), "context": context, "reanchor": plan.reanchor}
            raise
        out.timings.plan_ms = plan_ms
        out.layout = plan.layout
        out.reanchor = plan.reanchor
        if plan.prefix_trimmed or plan.suffix_trimmed:
            out.trimmed = {"prefix_tokens": plan.prefix_trimmed, "suffix_tokens": plan.suffix_trimmed}
        out.context = context
        return out

    def grow(self, path: str, should_stop=None, light: bool = False) -> None:
        """Idle work: put back the context a latency budget took from ``path``'s plan.

        Prefills the full plan's stable part, and the text typed since the anchor after it (EFIM),
        in another slot than the request's, in chunks of ``idle_chunk`` tokens, polling
        ``should_stop`` between them (Cancelled when it says stop; what was decoded stays in the
        slot, so the next call goes on from there). When it is complete, the file's anchor becomes
        the full one, so the next keystroke finds it cached.
        ``light``: between a request's tokens (no state saved or restored; see Reuse.start)."""
        if not self.reduced(path):
            return
        session = self.files.get(path).session
        reduced = session.anchor
        full = self.planner.full_anchor(reduced, self.config.max_tokens)
        tokens = self.planner.stable_tokens(session.layout, full, session.typed)
        self.run(tokens, CompletionRequest("", 0, path=path, max_tokens=0), path=path,
                 should_stop=should_stop, chunk=self.idle_chunk, idle=True, light=light)
        if session.anchor is reduced:  # nothing re-anchored the file meanwhile
            log.debug("%s: grown to the full plan (%d tokens)", path, len(tokens))
            session.anchor = full
            self.reuse.drop_others(path, np.asarray(tokens, dtype=np.int32))

    def reduced(self, path: str | None) -> bool:
        """Whether the budget reduced ``path``'s current plan (idle growth has work to do)."""
        f = self.files.get(path) if path else None
        return f is not None and f.session is not None and f.session.anchor is not None and f.session.anchor.reduced

    def _grow_alongside(self, path: str | None, t0: float, should_stop=None, yield_to=None):
        """For a request on ``path`` whose plan the budget reduced: a ``between()`` for its
        generation that spends ``grow_share`` of the time after the first token, until
        ``grow_window_ms`` after the request came, growing the plan a chunk at a time (another slot:
        the answer is unchanged). While someone types, the next keystroke most likely comes within
        the window and supersedes the completion; past it they are waiting for it, at full speed.
        ``yield_to()`` says other work waits (another file's request): growth stops for it too.
        None when there is nothing to grow."""
        share, window = self.config.grow_share, t0 + self.config.grow_window_ms / 1e3
        if share <= 0 or len(self.slots.slots) < 2 or not self.reduced(path):
            return None
        next_at = 0.0

        def between() -> None:
            nonlocal next_at
            t = time.perf_counter()
            if t < next_at or t >= window or not self.reduced(path):
                return
            deadline = t + self.config.idle_chunk_ms / 1e3
            stop = lambda: (time.perf_counter() >= deadline or (should_stop is not None and should_stop())
                            or (yield_to is not None and yield_to()))
            try:
                self.grow(path, stop, light=True)
            except Cancelled:
                pass
            except Exception:  # noqa: BLE001 - optional work never fails the request
                log.exception("growth during generation failed")
                next_at = math.inf
                return
            done = time.perf_counter()
            next_at = done + (done - t) * (1 - share) / share

        return between

    def idle_chunk(self, n_ctx: int) -> int:
        """Tokens per idle prefill chunk at ``n_ctx`` tokens of context: what prefills in about
        ``idle_chunk_ms`` on this machine now, within [8, idle_chunk_tokens]."""
        cap = self.config.idle_chunk_tokens
        if not self.speed.known:
            return cap
        return max(8, min(cap, self.speed.max_new(self.config.idle_chunk_ms, n_ctx)))

    def prefill(self, path: str, text: str, cursor: int, should_stop=None) -> None:
        """Idle work: compute the plan anchored at ``cursor`` as a request there would plan it (within
        the latency budget: the next keystroke finds its own anchor cached), then grow it to the full
        plan. Small chunks; Cancelled when ``should_stop`` says so, keeping what was computed."""
        self.complete(CompletionRequest(text, cursor, path=path, max_tokens=0),
                      should_stop=should_stop, chunk=self.idle_chunk, idle=True)
        self.grow(path, should_stop)

    def calibrate(self, should_stop=None, n: int = 64) -> None:
        """Idle work: measure prefill speed (for the latency budget) over ``4 * n`` tokens in chunks of
        ``n``, at growing context sizes (one pass: every prefill after it refines the speed), and
        build the token healer's index.

        Uses an empty slot (none: the requests so far have measured it) and leaves it empty; it is
        not a request, so nothing is counted or saved."""
        if self.default_heal:
            self.decoder.healer  # noqa: B018 - built now, not on the first keystroke (it reads the vocabulary)
        slot = next((s for s in self.slots.slots if not len(s.tokens)), None)
        if self.speed.known or slot is None:
            return
        seed = np.asarray(self.model.tokenize("def f(x):\n    return x + 1\n"), dtype=np.int32)
        tokens = np.resize(seed, 4 * n)
        try:  # chunks of a growing context: the decoder observes each (a per-token and a context cost)
            self.decoder.prefill(slot, tokens, 0, should_stop, n)
        finally:
            self.reuse.clear(slot)

    def run(self, tokens, req: CompletionRequest, path: str | None = None, cold: bool = False,
            t0: float | None = None, on_text=None, checkpoint: int | None = None,
            should_stop=None, heal: bytes = b"", chunk=None, idle: bool = False,
            closers: str = "", light: bool = False, yield_to=None) -> Completion:
        """Decode a token prompt in the best slot and generate. ``cold`` ignores all cached KV;
        ``idle`` work leaves the KV of the requests' slots whole (it grows a copy).

        ``checkpoint`` is the prompt length worth saving for sliding-window models.
        ``should_stop()`` is polled between batches (of at most ``chunk`` tokens) and tokens; when
        true, Cancelled is raised.
        ``heal`` is text backed off the prompt that the first tokens must spell out again;
        ``closers``: auto-paired closers after the cursor, where the answer stops.
        ``light``: see Reuse.start; ``yield_to()``: other work waits (growth during generation stops).
        """
        t0 = t0 if t0 is not None else time.perf_counter()
        self._fit_threads()
        prompt = np.asarray(tokens, dtype=np.int32)
        if len(prompt) == 0:
            raise InvalidParams("invalid params: the prompt is empty")
        want_sparse = req.sparse if req.sparse is not None else self.config.sparse_budget > 0
        start = self.reuse.start(prompt, path, want_sparse, cold, idle, light)
        slot = start.slot
        max_tokens = self._max_tokens(req)
        room = self.config.context.n_ctx_seq - len(prompt)
        rules = StopRules(max_tokens=min(max_tokens, room), stop_at_newline=req.stop_at_newline,
                          max_lines=req.max_lines, stop_strings=self.template.stop_strings, closers=closers)
        try:
            evaluated = self.decoder.prefill(slot, prompt, start.n_common, should_stop, chunk)
            counts = TokenCounts(prompt=len(prompt), cached=len(prompt) - evaluated, evaluated=evaluated)
            between = None if idle else self._grow_alongside(path, t0, should_stop, yield_to)
            if not idle:
                self.slots.busy = slot.seq
            with Sampler(SamplerParams(req.temperature, req.top_k, req.top_p, req.seed)) as sampler:
                ids, stream, reason, t_first = self.decoder.generate(
                    slot, len(prompt), sampler, rules, on_text, req.ignore_eog, should_stop, heal, between)
        except Cancelled as e:
            if isinstance(e.data, dict) and "first_token_at" in e.data:  # cancelled while generating
                counts.generated = e.data["generated"]
                e.data = {"tokens": asdict(counts), "timings": {"prompt_ms": (e.data["first_token_at"] - t0) * 1e3}}
            raise
        finally:
            if not idle:
                self.slots.busy = None
            self.reuse.finish(start, path, len(prompt), checkpoint, cold, idle)
        t2 = time.perf_counter()
        if reason == "max_tokens" and room < max_tokens:
            reason = "context_full"
        counts.generated = len(ids)
        first = t_first or t2
        # A short reuse (under the slot manager's min_reuse) still came from the slot.
        tier = ("slot" if start.tier == "none" else start.tier) if counts.cached else "none"
        return Completion(
            text=stream.text, stop_reason=reason, layout="tokens", tokens=counts,
            timings=Timings(prompt_ms=(first - t0) * 1e3, predict_ms=(t2 - first) * 1e3, total_ms=(t2 - t0) * 1e3),
            slot=slot.seq, cache_tier=tier, sparse=start.sparse, token_ids=ids)

    def _fit_threads(self) -> None:
        """Automatic threads: as many as the cores other processes leave free (engine/cpu.py)."""
        if self.cores is None:
            return
        free = self.cores.sample()
        want = (self.config.context.n_threads or free, self.config.context.n_threads_batch or free)
        if want != (self.ctx.n_threads, self.ctx.n_threads_batch):
            self.ctx.set_threads(*want)

    # -- idle work and maintenance ---------------------------------------------------------------
    def flush(self) -> None:
        """Save dirty slots (call after the response was sent, or when idle)."""
        self.reuse.flush()

    def forget(self, path: str) -> None:
        """The file changed on disk: plan it afresh on its next request."""
        self.files.forget_session(path)

    def clear_slots(self) -> None:
        """Empty every live slot (benchmarks: start each backend cold)."""
        for slot in self.slots.slots:
            self.reuse.clear(slot)

    # -- reporting --------------------------------------------------------------------------
    def sparse_status(self) -> str:
        """'off', 'on: budget 20%' or 'unavailable: <reason>' (InfiniGen sparse restore)."""
        if self.config.sparse_budget <= 0:
            return "off"
        if self.sparse.reason:
            return f"unavailable: {self.sparse.reason}"
        return f"on: budget {self.config.sparse_budget:.0%} of states >= {self.sparse.min_tokens} tokens"

    def slot_info(self) -> list[dict]:
        return [{"slot": s.seq, "path": s.path, "tokens": len(s.tokens)} for s in self.slots.slots]

    def status(self) -> dict:
        """What is loaded and how it is used (``efim status`` and the daemon's status)."""
        ctx = self.config.context
        return {
            "model": str(self.model.path), "description": self.model.description(), **library_info(),
            "layout": self.default_layout, "layout_reason": self.layout_reason,
            "heal": self.default_heal, "heal_reason": self.heal_reason,
            "fragment_trained": self.fragment_trained,
            "template": self.template.source, "n_slots": ctx.n_slots, "n_ctx_seq": ctx.n_ctx_seq,
            "threads": self.ctx.n_threads, "threads_batch": self.ctx.n_threads_batch,
            "threads_auto": self.cores is not None,
            "cores_free": self.cores.free if self.cores else None,
            "cores_used_by_others": round(self.cores.others, 2) if self.cores else None,
            "type_k": ctx.type_k, "type_v": ctx.type_v,
            "flash_attn": ctx.flash_attn, "offload_kqv": ctx.offload_kqv,
            "sliding_window": self.model.n_swa, "swa_strategy": self.swa_strategy,
            "state_restore": "whole-state checkpoints" if self.swa else "longest prefix",
            "sparse_restore": self.sparse_status(),
            "slots": self.slot_info(),
            "store": self.store.stats() if self.store else None,
        }
