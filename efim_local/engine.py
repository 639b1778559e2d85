"""The completion engine: one model, one context, several slots, EFIM plans."""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import templates
from .backend import Batch, Context, Model, NoKvSlot, Sampler, SamplerParams
from .config import Config
from . import healing
from .gguf_llama import KEY_FRAGMENT, KEY_LAYOUT
from .healing import Healer
from .planner import FileSession, Plan, Planner, PlannerLimits
from .slots import Slot, SlotManager
from .store import StateStore, StoreConfig, kvblob
from .store.fingerprint import layout_key, layout_params, model_fingerprint
from .stream import StopRules, TextStream

class Cancelled(Exception):
    """A request was cancelled or superseded; the prompt work done so far stays in its slot."""


RESTORE_MIN_GAIN = 32  # restore a saved state only if it saves at least this many tokens


@dataclass(frozen=True)
class CompletionRequest:
    text: str
    cursor: int  # offset in code points
    path: str = "<buffer>"
    max_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    layout: str | None = None
    stop_at_newline: bool = False
    max_lines: int | None = None
    ignore_eog: bool = False  # benchmarks: always generate max_tokens
    heal: bool = False  # token healing: re-choose the partial word's last token (non-fragment models)
    sparse: bool | None = None  # InfiniGen sparse restore of long saved states; None: the config's


@dataclass
class TokenCounts:
    prompt: int = 0
    cached: int = 0
    evaluated: int = 0
    generated: int = 0


@dataclass
class Timings:
    prompt_ms: float = 0.0  # planning + prefill + first token
    predict_ms: float = 0.0
    total_ms: float = 0.0
    plan_ms: float = 0.0  # planning alone (tokenizing the middle, anchoring)


@dataclass
class Completion:
    text: str
    stop_reason: str
    layout: str
    tokens: TokenCounts = field(default_factory=TokenCounts)
    timings: Timings = field(default_factory=Timings)
    reanchor: str | None = None
    slot: int = -1
    cache_tier: str = "none"  # where the reused KV came from: slot, ram, disk or none
    trimmed: dict = field(default_factory=dict)
    sparse: dict | None = None  # the sparse restore's report (approximate!), or why it fell back
    token_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("token_ids")
        return d


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
    """Owns the llama.cpp model and context. Not thread-safe: one thread drives it."""

    def __init__(self, config: Config, model_path: str | Path, store: StoreConfig | None = None):
        self.config = config
        self.model = Model(model_path, n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu)
        try:
            self.template, self.planner = make_planner(self.model, config)
            self.sparse = None
            if config.sparse_budget > 0:
                from .infinigen.select import SelectConfig
                from .infinigen.sparse import SparseMode

                self.sparse = SparseMode(self.model, Path(model_path), SelectConfig(
                    budget=config.sparse_budget, alpha=config.sparse_alpha), config.sparse_min_tokens)
            # Only a context that restores states needs the (slower) eval callback.
            cb = self.sparse.eval_callback if self.sparse and store is not None else None
            self.ctx = Context(self.model, config.context, cb)
        except Exception:
            self.model.close()
            raise
        self.batch = Batch(self.ctx.n_batch, config.context.n_slots)
        self.slots = SlotManager(config.context.n_slots)
        # With a unified KV cache llama.cpp lets any sequence use all cells; we cap each slot.
        self.n_ctx_seq = config.context.n_ctx_seq
        self.sessions: dict[str, FileSession] = {}
        # Sliding-window caches keep only the window when serialized: restore whole states only.
        self.swa = self.model.n_swa > 0
        self.swa_strategy = ("swa_full" if config.context.swa_full else "recompute") if self.swa else "none"
        self.n_stream = 1 if config.context.kv_unified else config.context.n_slots
        self.store = None
        if store is not None:
            import llama_cpp

            params = layout_params(config.context, llama_cpp.__version__)
            self.store = StateStore(store, model_fingerprint(model_path), layout_key(params), params,
                                    whole_state_only=self.swa)
            if self.sparse is not None:
                self.sparse.attach(self.ctx, self.batch, self.n_stream, self.model.n_swa)
                if self.sparse.skew is not None:
                    frac = store.shrink_to
                    self.store.shrink = lambda payload, partial, sel: self.sparse.shrink(payload, partial, sel, frac)
        self.fragment_trained = (self.model.meta(KEY_FRAGMENT) or "").lower() == "true"
        self.default_layout = config.layout or (
            (self.model.meta(KEY_LAYOUT) or "efim") if self.fragment_trained else "fim")

    def sparse_status(self) -> str:
        """'off', 'on: budget 20%' or 'unavailable: <reason>' (InfiniGen sparse restore)."""
        if self.config.sparse_budget <= 0:
            return "off"
        if self.sparse.reason:
            return f"unavailable: {self.sparse.reason}"
        return f"on: budget {self.config.sparse_budget:.0%} of states >= {self.sparse.min_tokens} tokens"

    @property
    def healer(self) -> Healer:
        if getattr(self, "_healer", None) is None:
            self._healer = Healer([self.model.piece(t) for t in range(self.model.n_vocab)])
        return self._healer

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Save dirty slots to disk, then free llama.cpp objects."""
        if getattr(self, "store", None) is not None and getattr(self, "ctx", None) is not None:
            try:
                self.flush()
                self.store.spill()
            finally:
                self.store.close()
                self.store = None
        for h in ("batch", "ctx", "model"):
            obj = getattr(self, h, None)
            if obj is not None:
                obj.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- public API -----------------------------------------------------------
    def plan(self, req: CompletionRequest) -> Plan:
        session = self.sessions.setdefault(req.path, FileSession(layout=self.default_layout))
        return self.planner.plan(session, req.text, req.cursor, req.layout, reserve=self._max_tokens(req))

    def _max_tokens(self, req: CompletionRequest) -> int:
        return req.max_tokens if req.max_tokens is not None else self.config.max_tokens

    def complete(self, req: CompletionRequest, on_text=None, should_stop=None) -> Completion:
        """Plan and complete a request. ``on_text`` receives streamed text; see run() for ``should_stop``."""
        t0 = time.perf_counter()
        plan = self.plan(req)
        tokens, heal = plan.tokens, b""
        if req.heal and plan.middle_tokens and Healer.should_heal(self.model.piece(plan.middle_tokens[-1])):
            # Back off the middle's last token; generation must spell it out again.
            cut = plan.middle_start + len(plan.middle_tokens) - 1
            heal = self.model.piece(tokens[cut])
            tokens = tokens[:cut] + tokens[cut + 1:]
        plan_ms = (time.perf_counter() - t0) * 1e3
        out = self.run(tokens, req, path=req.path, t0=t0, checkpoint=plan.middle_start,
                       on_text=on_text, should_stop=should_stop, heal=heal)
        self.slots.slots[out.slot].text = req.text
        out.timings.plan_ms = plan_ms
        out.layout = plan.layout
        out.reanchor = plan.reanchor
        if plan.prefix_trimmed or plan.suffix_trimmed:
            out.trimmed = {"prefix_tokens": plan.prefix_trimmed, "suffix_tokens": plan.suffix_trimmed}
        return out

    def run(self, tokens, req: CompletionRequest, path: str | None = None, cold: bool = False,
            t0: float | None = None, on_text=None, checkpoint: int | None = None,
            should_stop=None, heal: bytes = b"") -> Completion:
        """Decode a token prompt in the best slot and generate. ``cold`` ignores all cached KV.

        ``checkpoint`` is the prompt length worth saving for sliding-window models.
        ``should_stop()`` is polled between batches and tokens; when true, Cancelled is raised.
        ``heal`` is text backed off the prompt that the first tokens must spell out again.
        """
        t0 = t0 if t0 is not None else time.perf_counter()
        prompt = np.asarray(tokens, dtype=np.int32)
        if len(prompt) == 0:
            raise ValueError("empty prompt")
        slot, n_common = self.slots.pick(prompt)
        want_sparse = req.sparse if req.sparse is not None else self.config.sparse_budget > 0
        if slot.sparse and (not want_sparse or cold):  # approximate KV never serves an exact request
            self.ctx.seq_rm(slot.seq, 0, -1)
            slot.reset()
            n_common = 0
        # The same prompt again leaves the KV as it was: nothing new to save.
        same = n_common == len(prompt) == len(slot.tokens)
        if slot.dirty and slot.path != path:
            self._save(slot)  # the slot is about to serve another file: keep its state
        tier = "slot" if n_common >= self.slots.min_reuse else "none"
        sparse = None
        if cold:
            n_common, tier = 0, "none"
        elif self.store is not None:
            n_common, tier, sparse = self._from_store(slot, prompt, n_common, tier, path, want_sparse)
        max_tokens = self._max_tokens(req)
        room = self.n_ctx_seq - len(prompt)
        rules = StopRules(max_tokens=min(max_tokens, room), stop_at_newline=req.stop_at_newline,
                          max_lines=req.max_lines, stop_strings=self.template.stop_strings)
        try:
            evaluated = self._prefill(slot, prompt, n_common, should_stop)
            counts = TokenCounts(prompt=len(prompt), cached=len(prompt) - evaluated, evaluated=evaluated)
            with Sampler(SamplerParams(req.temperature, req.top_k, req.top_p, req.seed)) as sampler:
                ids, stream, reason, t_first = self._generate(slot, len(prompt), sampler, rules, on_text,
                                                              req.ignore_eog, should_stop, heal)
        finally:
            # Keep the prompt (as far as it was decoded), drop the output: the next keystroke reuses it.
            if not self.ctx.seq_rm(slot.seq, len(slot.tokens), -1):
                self.ctx.seq_rm(slot.seq, 0, -1)
                slot.reset()
            slot.touch(path)
            slot.dirty = (self.store is not None and len(slot.tokens) > 0 and not slot.sparse
                          and (slot.dirty or not same or cold))
            ck = checkpoint if checkpoint is not None else len(prompt) - 1
            slot.checkpoint = max(0, min(ck, len(prompt) - 1, len(slot.tokens)))
        t2 = time.perf_counter()
        if reason == "max_tokens" and room < max_tokens:
            reason = "context_full"
        counts.generated = len(ids)
        first = t_first or t2
        return Completion(
            text=stream.text, stop_reason=reason, layout="tokens", tokens=counts,
            timings=Timings(prompt_ms=(first - t0) * 1e3, predict_ms=(t2 - first) * 1e3, total_ms=(t2 - t0) * 1e3),
            slot=slot.seq, cache_tier=tier, sparse=sparse, token_ids=ids)

    # -- the state store --------------------------------------------------------
    def _from_store(self, slot: Slot, prompt: np.ndarray, n_common: int, tier: str, path: str | None,
                    want_sparse: bool = False):
        """Restore a saved state into ``slot`` if it beats what the slot holds.
        Returns (tokens reused, tier, sparse report or None)."""
        store = self.store
        if n_common + RESTORE_MIN_GAIN >= len(prompt):
            store.count("hit_slot")
            return n_common, tier, None
        found = store.lookup(prompt, path, shrunk=want_sparse and self.sparse is not None)
        m = found.match
        if m is None or m.n < n_common + RESTORE_MIN_GAIN:
            store.count("hit_slot" if tier == "slot" else f"miss_{found.miss_reason or 'no_state'}")
            return n_common, tier, None
        n = len(m.tokens) if self.swa else min(m.n, len(prompt) - 1)
        if n >= len(prompt):  # a whole sliding-window state as long as the prompt: nothing left to decode
            store.count("hit_slot" if tier == "slot" else "miss_no_state")
            return n_common, tier, None
        payload = store.load(m, n)
        if payload is None:  # the state file was bad and has been dropped; the slot is untouched
            store.count("miss_corrupt")
            return n_common, tier, None
        report = None
        if m.kept < 1 or (want_sparse and n >= (self.sparse.min_tokens if self.sparse else 0)):
            report = self._sparse_restore(slot, prompt, n, m, payload)
            if "fallback" not in report:
                return n, m.tier, report
            if m.kept < 1:  # a shrunk state is approximate: never restore it as if it were whole
                return n_common, tier, report
        try:
            self.ctx.set_seq_state(slot.seq, kvblob.wrap(payload, self.n_stream))
            # Verify before decoding: the slot must hold exactly positions [0, n).
            ok = self.ctx.seq_pos_max(slot.seq) == n - 1
        except Exception:  # llama.cpp rejected it, or it does not parse
            ok = False
        if ok:
            slot.tokens, slot.dirty = prompt[:n], False
            store.count(f"hit_{m.tier}")
            return n, m.tier, report
        self.ctx.seq_rm(slot.seq, 0, -1)
        slot.reset()
        store.count("dropped_corrupt")
        store.count("miss_corrupt")
        return 0, "none", report

    def _sparse_restore(self, slot: Slot, prompt: np.ndarray, n: int, m, payload: bytes) -> dict:
        """InfiniGen: restore only the cells speculated to matter; {"fallback": reason} if it cannot."""
        from .infinigen.select import Unsupported

        if self.sparse is None or self.sparse.restorer is None:
            return {"fallback": self.sparse.reason if self.sparse and self.sparse.reason else "off"}
        try:
            report = self.sparse.restore(slot.seq, payload, prompt[n:], self.store.load_partial(m.id))
        except Unsupported as e:
            return {"fallback": e.reason}
        except Exception:  # llama.cpp rejected the edited state: restore it fully instead
            self.ctx.seq_rm(slot.seq, 0, -1)
            return {"fallback": "rejected"}
        slot.tokens, slot.dirty, slot.sparse = prompt[:n], False, True
        self.store.count(f"hit_{m.tier}")
        self.store.count("sparse_restores")
        self.store.note_selection(m.id, self.sparse.restorer.last_positions)
        report["shrunk_state"] = m.kept < 1
        return report

    def _save(self, slot: Slot) -> None:
        """Serialize a slot into the store (RAM tier). Sliding-window models save their checkpoint."""
        slot.dirty = False
        if slot.sparse:  # a subset of a saved state: the full one is already stored
            return
        toks = slot.tokens
        n = min(slot.checkpoint, len(toks)) if self.swa else len(toks)
        if self.store is None or n < self.store.cfg.min_tokens:
            return
        if n < len(toks):
            self.ctx.seq_rm(slot.seq, n, -1)
            blob = self.ctx.seq_state(slot.seq)
            slot.tokens = toks[:n]
            self._prefill(slot, toks, n)  # put the rest back
        else:
            blob = self.ctx.seq_state(slot.seq)
        content = hashlib.sha1(slot.text.encode("utf-8", "surrogatepass")).hexdigest() if slot.text else ""
        payload = kvblob.normalize(blob)
        partial = self.sparse.partial_npz(payload) if self.sparse and n >= self.sparse.min_tokens else None
        self.store.put(toks[:n], payload, slot.path or "", content, partial)

    def flush(self) -> None:
        """Save dirty slots (call after the response was sent, or when idle)."""
        if self.store is None:
            return
        for slot in self.slots.slots:
            if slot.dirty:
                self._save(slot)
        self.store.flush_counts()

    # -- internals ------------------------------------------------------------
    def _prefill(self, slot: Slot, prompt: np.ndarray, n_common: int, should_stop=None) -> int:
        """Make ``slot`` hold KV for prompt[:-1] plus logits for the last token; returns tokens evaluated."""
        n_common = min(n_common, len(prompt) - 1)  # the last token is decoded to get logits
        if not self.ctx.seq_rm(slot.seq, n_common, -1):
            self.ctx.seq_rm(slot.seq, 0, -1)  # cannot truncate here: recompute from scratch
            n_common = 0
        slot.tokens = prompt[:n_common]
        pos = n_common
        while pos < len(prompt):
            if should_stop is not None and should_stop():
                raise Cancelled()
            chunk = prompt[pos:pos + self.batch.capacity]
            self.batch.clear()
            self.batch.extend(chunk, pos, slot.seq)
            if pos + len(chunk) == len(prompt):
                self.batch.raw.logits[len(chunk) - 1] = True
            self._decode(slot)
            pos += len(chunk)
            slot.tokens = prompt[:pos]
        return len(prompt) - n_common

    def _decode(self, slot: Slot) -> None:
        """Decode the batch; on a full KV cache evict other slots (LRU first) and retry."""
        while True:
            try:
                return self.ctx.decode(self.batch)
            except NoKvSlot:
                victim = self.slots.lru(exclude={slot.seq})
                if victim is None:
                    raise
                self.ctx.seq_rm(victim.seq, 0, -1)
                victim.reset()

    def _generate(self, slot: Slot, n_prompt: int, sampler: Sampler, rules: StopRules, on_text,
                  ignore_eog: bool = False, should_stop=None, heal: bytes = b""):
        """Sample until a stop rule fires; returns (ids, stream, stop_reason, time of first token)."""
        stream = TextStream(rules)
        ids: list[int] = []
        row = self.batch.raw.n_tokens - 1
        stop_tokens = self.template.stop_tokens
        t_first, reason = None, "max_tokens"
        while len(ids) < rules.max_tokens:
            if heal:  # constrained: the token must agree with the backed-off text
                tok = healing.pick(self.ctx.logits(row), self.healer.allowed(heal))
                raw = self.model.piece(tok)
                raw, heal = (raw[len(heal):], b"") if raw.startswith(heal) else (b"", heal[len(raw):])
            else:
                tok = sampler.sample(self.ctx, row)
                raw = self.model.piece(tok)
            if t_first is None:
                t_first = time.perf_counter()
            if not ignore_eog and (self.model.is_eog(tok) or tok in stop_tokens):
                reason = "eog"
                break
            ids.append(tok)
            piece = stream.feed(raw)
            if piece and on_text:
                on_text(piece)
            if stream.stop_reason:
                reason = stream.stop_reason
                break
            if len(ids) >= rules.max_tokens:
                break
            if should_stop is not None and should_stop():
                raise Cancelled()
            self.batch.clear()
            self.batch.add(tok, n_prompt + len(ids) - 1, slot.seq, logits=True)
            self._decode(slot)
            row = 0
        tail = stream.finish()
        if tail and on_text:
            on_text(tail)
        return ids, stream, reason, t_first
