"""The completion engine: one model, one context, several slots, EFIM plans.

The engine holds the resources and answers one question at a time; what runs when is the
scheduler's (``scheduler.py``). The data path of a request (``run.py``): plan it (``prompt/``),
find where its KV starts (``reuse.py``: live slot, saved state, sparse restore), decode the rest and
sample (``decode.py``), keep the prompt's KV for the next keystroke. Work for requests that have
not come yet (growth, prefill, calibration) is in ``background.py``.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..config import Config
from ..kv import StateStore, StoreConfig
from ..kv.fingerprint import layout_key, layout_params
from ..llama import Batch, Context, Model
from ..prompt import templates
from ..prompt.healing import Healer
from ..prompt.planner import FileSession, Plan, Planner, PlannerLimits, near_share
from ..request import CompletionRequest, Options
from . import background, tokenizing
from .backends import Local, Replicas
from .completion import Completion
from .cpu import FreeCores
from .decode import Decoder, Links
from .files import Files
from .instant import Instant, Trail, model_key
from .models import KIND_FRAGMENT, choose_layout, model_kind
from .pace import Pace
from .policy import Policy
from .reuse import Reuse
from .run import RunOptions, Runner
from .slots import SlotManager
from .speed import PrefillSpeed, load_speed, save_speed, speed_path
from .status import StatusReport
from .steps import drive

if TYPE_CHECKING:
    from ..backend import Pool


log = logging.getLogger("efim.engine")


def make_planner(model: Model, config: Config) -> tuple[templates.Template, Planner]:
    """The FIM template and the planner a config gives for ``model`` (as the engine plans)."""
    template = templates.resolve(
        model, family=config.fim_family,
        text=templates.parse_text_template(config.fim_template) if config.fim_template else None,
        order=config.fim_order)
    if template.source != "text":
        ends = tuple(t for t in range(model.n_vocab) if model.is_eog(t))
        template = templates.with_special_texts(template, lambda t: model.piece(t, special=True), ends)
    planner = Planner(tokenizing.Tokenizer(model.tokenize), template.markers, PlannerLimits(
        n_ctx=config.context.n_ctx_seq, max_middle_tokens=config.max_middle_tokens,
        reserve_tokens=config.max_tokens), lift_indent=model_kind(model.meta) != KIND_FRAGMENT)
    return template, planner


class Engine:
    """Owns the llama.cpp model and context. Not thread-safe: one thread drives it.

    Use it as a context manager; ``close()`` saves dirty slots, then frees everything in
    reverse order of creation. ``policy``: its timing and scheduling tunables and its clock
    (``policy.py``; None: the defaults). ``pool(model)``: the replicas that run its requests first,
    the local model behind them (``remote.open_remote``). Where its prompts are decoded is its
    ``backend`` (``backends.py``: here, or replicas first), which the parts that differ ask."""

    repo = None  # repoctx.RepoLeads: repository context before the files' prefixes (config repo_context)
    repo_build = None  # repobuild.RepoBuild: its idle steps (config repo_context)
    local_model = True  # weights and a context: prompts can decode here (with replicas: a fallback)

    def __init__(self, config: Config, model_path: str | Path, store: StoreConfig | None = None,
                 policy: Policy | None = None, pool: Callable[[Model], Pool] | None = None):
        self.config = config
        self.policy = Policy() if policy is None else policy
        with ExitStack() as stack:
            self.model = self._open_model(stack, model_path)
            # The pool opens once the model is loaded: the ids the replicas name are checked against its
            # vocabulary.
            self.backend = Local(self) if pool is None else Replicas(self, pool(self.model), self.local_model)
            self.template, self.planner = make_planner(self.model, config)
            self.tokenizer = self.planner.tokenize  # (interruptible for idle work: ``stopping``)
            self.files = Files()
            ends = self._open_decoding(stack, model_path, store)
            self._open_parts(model_path, ends)
            self._stack = stack.pop_all()

    def _open_model(self, stack: ExitStack, model_path: str | Path) -> Model:
        """The model, with its weights."""
        model = stack.enter_context(Model(model_path, n_gpu_layers=self.config.n_gpu_layers,
                                          main_gpu=self.config.main_gpu))
        stack.callback(tokenizing.drain)  # a tokenize call idle work left running reads the model
        return model

    def _open_decoding(self, stack: ExitStack, model_path: str | Path, store: StoreConfig | None):
        """What decoding here takes: the context, its slots and their KV's reuse, the state store, the
        decoder and the learned speed; the repository context (config ``repo_context``). Returns
        ``ends(token)``: whether a token ends a generation."""
        config, policy = self.config, self.policy
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
        # Sliding-window caches keep only the window when serialized: restore whole states only.
        self.swa = self.model.n_swa > 0
        self.swa_strategy = ("swa_full" if config.context.swa_full else "recompute") if self.swa else "none"
        self.n_stream = 1 if config.context.kv_unified else config.context.n_slots
        self.store = None
        if store is not None:
            import llama_cpp

            params = layout_params(config.context, llama_cpp.__version__)
            # A store that cannot be used (full disk, not a directory) is None, with one warning.
            shrink = self.sparse.shrink if self.sparse is not None and self.sparse.skew is not None else None
            self.store = StateStore.open(store, model_path, layout_key(params), params, self.swa, shrink)
            if self.store is not None:
                stack.enter_context(self.store)
            if self.store is not None and self.sparse is not None:
                self.sparse.attach(self.ctx, self.batch, self.n_stream, self.model.n_swa)
        cp = config.context
        # Automatic threads; not with flash attention, whose single-token split over the KV follows
        # the thread count (the answer must not depend on the machine's load).
        auto = not (cp.n_threads and cp.n_threads_batch) and not cp.flash_attn
        self.cores = FreeCores(policy=policy) if auto else None
        links = Links(observe=self.backend.observe,  # (with replicas the budget's speed is theirs)
                      predict_ms=lambda n, c: self.speed.predict_ms(n, c) if self.speed.known else None,
                      fit=self.fit_threads,  # per decode: one long answer adapts too
                      markers=self.template.markers,
                      free_cores=lambda: (self.cores.free, self.cores.cores) if self.cores else (1, 1))
        self.decoder = Decoder(self.model, self.ctx, self.batch, self.slots, self.template.stop_tokens, policy,
                               links, drafting=config.drafts)
        stack.enter_context(self.decoder.greedy)
        self.reuse = Reuse(self.ctx, self.slots, self.decoder, self.files, self.store, self.sparse,
                           self.n_stream, self.swa)
        self._learn_speed(store, model_path)
        if config.repo_context:
            from .repobuild import RepoBuild
            from .repoctx import RepoLeads

            self.repo = RepoLeads(self, Path(store.dir) / "repo" if store is not None else None)
            stack.callback(self.repo.close)
            self.repo_build = RepoBuild(self)
        if self.store is not None:  # last in, first out: saves run before the store closes
            stack.callback(self._save_all)
        return self.decoder.ends

    def _open_parts(self, model_path: str | Path, ends: Callable[[int], bool]) -> None:
        """What every engine has, wherever its prompts are decoded: the objects that do its work, the
        answer cache and the trail, its default layout and healing."""
        config = self.config
        self.last_context = (0, 0)  # (tokens, full plan's) of the latest request's plan (note_context)
        self.active_at = 0.0  # policy.clock() of the latest foreground work (mark_active)
        self.pace = Pace(self.policy)  # keystrokes and requests: when the next request can come (idle chunks' size)
        self.runner = Runner(self)  # requests as steps: the budget's plan, the slot, prefill, generation
        self.growth = background.Growth(self)  # work for requests to come: growth, prefill, idle chunks
        self.status_report = StatusReport(self)  # ``efim status`` and the daemon's status
        self.instant = Instant(self.model, model_key(model_path), ends, config.answer_cache)
        self.trail = Trail(self)  # the shown answer's continuation, extended while idle
        self.fragment_trained = model_kind(self.model.meta) == KIND_FRAGMENT
        text_markers = self.template.source == "text"
        self.default_layout, self.layout_reason = choose_layout(self.model.meta, config.layout, text_markers)
        self.default_heal, self.heal_reason = self.backend.choose_heal(self.model.meta, text_markers, config.heal)

    def _learn_speed(self, store: StoreConfig | None, model_path) -> None:
        """The prefill speed, learned from every prefill; the latency budget asks it. Saved beside the
        states, it serves the next start (and in-process runs) at once. With replicas it is theirs:
        neither loaded nor saved as this machine's speed."""
        self.speed_file = None
        if self.store is not None and self.backend.own_speed:
            self.speed_file = speed_path(store.dir, model_path, self.config.context)
        self.speed = ((load_speed(self.speed_file, self.policy) if self.speed_file else None)
                      or PrefillSpeed(policy=self.policy))
        self._saved_speed = self.speed.n
        self._near_sized_at: float | None = None  # when size_near last changed it (None: never sized)

    def read_speed(self, store_dir) -> None:
        """Take the speed a daemon or an earlier run saved in ``store_dir``, if any (an engine opened
        without a store: ``efim status`` in-process)."""
        if self.backend.own_speed:
            path = speed_path(store_dir, self.model.path, self.config.context)
            self.speed = load_speed(path, self.policy) or self.speed

    # -- lifetime -------------------------------------------------------------------------
    def _save_all(self) -> None:
        self.reuse.flush()
        self._save_speed(1)
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
        return self.files.session(path, self.default_layout)

    def plan(self, req: CompletionRequest) -> Plan:
        """The token plan for a request (and the file's new anchor, if it moved)."""
        session = self.session(req.path)
        self.size_near()
        if self.repo is not None and session.anchor is None:
            try:
                self.repo.adopt(session, req.path)
            except Exception:  # noqa: BLE001 - optional context never fails a request: file-only
                log.exception("repository context not adopted")
        plan = self.planner_for(session).plan(session, req.text, req.cursor, req.how.layout,
                                              reserve=self.max_tokens(req.how))
        if session.note is not None:  # the first plan on an anchor that background work switched to
            plan, session.note = replace(plan, reanchor=plan.reanchor or session.note), None
        self.files.note_request(req.path, req.text, req.cursor)
        return plan

    def size_near(self) -> None:
        """Sizes the near window (prompt/windows.py) by the learned prefill speed: the largest share of
        the room whose near plan it computes within ``policy.near_max_ms`` (an eighth on the 0.5B
        shape here, a thirty-second on the 1.5B). It shrinks as soon as the speed falls (a busy
        machine; a fresh daemon's first guess) and grows back only when the bigger share computes
        within ``policy.near_regrow`` of that, ``policy.near_resize_s`` after its last change at the
        soonest, so near windows stay put while the speed wavers."""
        if not self.speed.known or not self.backend.own_speed:  # (replicas: the speed is theirs)
            return
        policy = self.policy
        sized, clock = self._near_sized_at, policy.clock()
        space, now = self.planner.space(self.config.max_tokens), self.planner.near
        fits = lambda ms: near_share(space, lambda n: self.speed.predict_ms(n, 0), ms)
        size = lambda share: space // share if share else 0
        share = fits(policy.near_max_ms)
        if sized is not None and size(share) >= size(now):
            if clock - sized < policy.near_resize_s:
                return
            share = fits(policy.near_max_ms * policy.near_regrow)
            if size(share) <= size(now):
                return
        self._near_sized_at = clock
        if share != now:
            self.planner = replace(self.planner, near=share)
            log.info("near window: %s", f"1/{share} of the room ({space // share} tokens)"
                     if share else "none (too slow for a near plan within its time)")

    def planner_for(self, session: FileSession) -> Planner:
        """The planner of a file's plans: with its repository context (``session.lead``) after BOS."""
        return self.planner_with(session.lead)

    def planner_with(self, lead: tuple[int, ...]) -> Planner:
        """The planner whose plans put ``lead`` after BOS (the lead is never trimmed: it is a marker)."""
        if not lead:
            return self.planner
        m = self.planner.markers
        return replace(self.planner, markers=replace(m, bos=(*m.bos, *lead)))

    @property
    def healer(self) -> Healer:
        """The vocabulary's index for token healing."""
        return self.decoder.healer

    def max_tokens(self, how: Options) -> int:
        """The most tokens a request may generate."""
        return how.max_tokens if how.max_tokens is not None else self.config.max_tokens

    def complete(self, req: CompletionRequest, on_text=None, should_stop=None) -> Completion:
        """Plan and complete a request, growing its reduced plan alongside as the daemon does.
        ``on_text`` receives streamed text; ``should_stop()`` cancels (Cancelled)."""
        ride = background.Alongside(self, req.path, self.mark_active(), should_stop)
        steps = self.runner.complete_steps(req, RunOptions(on_text=on_text, should_stop=should_stop))
        return background.drive_riding(steps, ride)

    def run(self, tokens, how: Options, cold: bool = False, closers: str = "", path: str | None = None,
            heal: bytes = b"") -> Completion:
        """Decode a token prompt in the best slot and generate; ``cold`` ignores all cached KV; the
        first tokens spell out ``heal`` (text backed off the prompt)."""
        return drive(self.runner.run_steps(tokens, how, RunOptions(path=path, cold=cold, closers=closers, heal=heal)))

    def fit_threads(self) -> None:
        """Automatic threads: as many as the cores other processes leave free (engine/cpu.py)."""
        if self.cores is None:
            return
        free = self.cores.sample()
        want = (self.config.context.n_threads or free, self.config.context.n_threads_batch or free)
        if want != (self.ctx.n_threads, self.ctx.n_threads_batch):
            self.ctx.set_threads(*want)

    def mark_active(self) -> float:
        """Foreground work runs now (a request's step, a call: the engine thread): idle chunks stay short
        right after (Growth.idle_chunk). The time noted (``policy.clock``)."""
        self.active_at = self.policy.clock()
        return self.active_at

    def note_context(self, used: int, full: int) -> None:
        """The latest request planned ``used`` tokens of its ``full`` plan's (``interrupt`` reads it)."""
        self.last_context = (used, full)

    def interruptible(self, on: bool) -> None:
        """While ``on`` (the scheduler runs background work), prompt batches stop at :meth:`interrupt`."""
        self.decoder.batches_interruptible(on)

    def interrupt(self) -> None:
        """A request or a call came (any thread): an interruptible batch stops now, not at its end.
        Unless little of it is left: less than half of it, and less than half of ``Growth.patience_s`` (a
        chunk of the usual size; idle chunks grow in quiet spells, Growth.idle_chunk): finishing
        it wastes less than dropping it. And unless the latest answer had little context
        (``policy.starved``) and no more than ``patience_s`` is left: then every batch of growth is worth
        more than the wait (on the 1.5B shape, interrupting cut the mean context from 15% to 4% of
        the full plan). Either way the next batch stops at once.

        It only asks (llama.cpp's abort flag, or the decoder's stop-next count) and reads the rest: the
        engine thread notes the foreground work's time itself (``mark_active``, Scheduler.tick). The
        decision is taken here, not where the engine thread reads the ask: a batch in progress is in
        llama_decode, whose abort callback reads one byte."""
        now = self.policy.clock()
        span = self.decoder.batch_span
        used, full = self.last_context
        starved = used < min(self.policy.starved, full)
        if span is None:
            wait = starved
        else:
            left, whole = span[1] - now, span[1] - span[0]
            patience = self.growth.patience_s
            wait = left < (patience if starved else min(whole, patience) / 2)
        if wait:
            self.decoder.ask_stop_next()
            return
        self.ctx.interrupt()

    # -- background work, run to its end (the daemon's scheduler runs it in steps) ---------------
    def grow(self, path: str, should_stop=None) -> None:
        """Put back the context a latency budget took from ``path``'s plan (Growth.grow_steps)."""
        drive(self.growth.grow_steps(path, should_stop))

    def prefill(self, path: str, text: str, cursor: int, should_stop=None) -> None:
        """Compute the plan a request at ``cursor`` would make, then grow it (Growth.prefill_steps)."""
        drive(self.growth.prefill_steps(path, text, cursor, should_stop))

    def ahead(self, path: str, should_stop=None, limit: int | None = None, typed: int | None = None) -> None:
        """Extend the greedy continuation of ``path``'s last answer (Trail.ahead_steps)."""
        drive(self.trail.ahead_steps(path, should_stop, limit, typed))

    def calibrate(self, should_stop=None) -> None:
        """Measure the prefill speed and build the healer's index (Growth.calibrate_steps)."""
        drive(self.growth.calibrate_steps(should_stop))

    def reduced(self, path: str | None) -> bool:
        """Whether the budget reduced ``path``'s current plan (growth has work to do)."""
        return self.growth.reduced(path)

    # -- maintenance -------------------------------------------------------------------------
    def flush(self) -> None:
        """Save dirty slots and what was learned of the speed (after the response was sent, or when idle)."""
        self.reuse.flush()
        self._save_speed(8)

    def _save_speed(self, new: int) -> None:
        """Save the learned speed if ``new`` observations came since the last save."""
        if self.speed_file is not None and self.speed.n >= self._saved_speed + new:
            try:
                save_speed(self.speed, self.speed_file)
                self._saved_speed = self.speed.n
            except OSError as e:
                log.debug("speed not saved: %s", e)

    def forget(self, path: str) -> None:
        """The file changed on disk: plan it afresh on its next request."""
        self.files.forget_session(path)

    def clear_slots(self) -> None:
        """Empty every live slot (benchmarks: start each backend cold)."""
        for slot in self.slots.slots:
            self.reuse.clear(slot)
        if self.instant is not None:
            self.instant.clear()

    def status(self) -> dict:
        """What is loaded and how it is used (``efim status`` and the daemon's status)."""
        return self.status_report.engine_status()
