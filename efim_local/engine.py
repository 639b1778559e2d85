"""The completion engine: one model, one context, several slots, EFIM plans."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import templates
from .backend import Batch, Context, Model, NoKvSlot, Sampler, SamplerParams
from .config import Config
from .gguf_llama import KEY_FRAGMENT, KEY_LAYOUT
from .planner import FileSession, Plan, Planner, PlannerLimits
from .slots import Slot, SlotManager
from .stream import StopRules, TextStream


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


@dataclass
class Completion:
    text: str
    stop_reason: str
    layout: str
    tokens: TokenCounts = field(default_factory=TokenCounts)
    timings: Timings = field(default_factory=Timings)
    reanchor: str | None = None
    slot: int = -1
    trimmed: dict = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("token_ids")
        return d


class Engine:
    """Owns the llama.cpp model and context. Not thread-safe: one thread drives it."""

    def __init__(self, config: Config, model_path: str | Path):
        self.config = config
        self.model = Model(model_path, n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu)
        try:
            self.template = templates.resolve(
                self.model, family=config.fim_family,
                text=templates.parse_text_template(config.fim_template) if config.fim_template else None,
                order=config.fim_order)
            self.ctx = Context(self.model, config.context)
        except Exception:
            self.model.close()
            raise
        self.batch = Batch(self.ctx.n_batch, config.context.n_slots)
        self.slots = SlotManager(config.context.n_slots)
        # With a unified KV cache llama.cpp lets any sequence use all cells; we cap each slot.
        self.n_ctx_seq = config.context.n_ctx_seq
        self.planner = Planner(self.model.tokenize, self.template.markers, PlannerLimits(
            n_ctx=self.n_ctx_seq, max_middle_tokens=config.max_middle_tokens, reserve_tokens=config.max_tokens))
        self.sessions: dict[str, FileSession] = {}
        self.fragment_trained = (self.model.meta(KEY_FRAGMENT) or "").lower() == "true"
        self.default_layout = config.layout or (
            (self.model.meta(KEY_LAYOUT) or "efim") if self.fragment_trained else "fim")

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
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

    def complete(self, req: CompletionRequest) -> Completion:
        t0 = time.perf_counter()
        plan = self.plan(req)
        out = self.run(plan.tokens, req, path=req.path, t0=t0)
        out.layout = plan.layout
        out.reanchor = plan.reanchor
        if plan.prefix_trimmed or plan.suffix_trimmed:
            out.trimmed = {"prefix_tokens": plan.prefix_trimmed, "suffix_tokens": plan.suffix_trimmed}
        return out

    def run(self, tokens, req: CompletionRequest, path: str | None = None, cold: bool = False,
            t0: float | None = None, on_text=None) -> Completion:
        """Decode a token prompt in the best slot and generate. ``cold`` ignores all cached KV."""
        t0 = t0 if t0 is not None else time.perf_counter()
        prompt = np.asarray(tokens, dtype=np.int32)
        if len(prompt) == 0:
            raise ValueError("empty prompt")
        slot, n_common = self.slots.pick(prompt)
        if cold:
            n_common = 0
        evaluated = self._prefill(slot, prompt, n_common)
        counts = TokenCounts(prompt=len(prompt), cached=len(prompt) - evaluated, evaluated=evaluated)
        max_tokens = self._max_tokens(req)
        room = self.n_ctx_seq - len(prompt)
        rules = StopRules(max_tokens=min(max_tokens, room), stop_at_newline=req.stop_at_newline,
                          max_lines=req.max_lines, stop_strings=self.template.stop_strings)
        with Sampler(SamplerParams(req.temperature, req.top_k, req.top_p, req.seed)) as sampler:
            ids, stream, reason, t_first = self._generate(slot, len(prompt), sampler, rules, on_text,
                                                          req.ignore_eog)
        # Keep the prompt, drop the output: the next keystroke reuses the prompt.
        if not self.ctx.seq_rm(slot.seq, len(prompt), -1):
            self.ctx.seq_rm(slot.seq, 0, -1)
            prompt = prompt[:0]
        slot.tokens = prompt
        slot.touch(path)
        t2 = time.perf_counter()
        if reason == "max_tokens" and room < max_tokens:
            reason = "context_full"
        counts.generated = len(ids)
        first = t_first or t2
        return Completion(
            text=stream.text, stop_reason=reason, layout="tokens", tokens=counts,
            timings=Timings(prompt_ms=(first - t0) * 1e3, predict_ms=(t2 - first) * 1e3, total_ms=(t2 - t0) * 1e3),
            slot=slot.seq, token_ids=ids)

    # -- internals ------------------------------------------------------------
    def _prefill(self, slot: Slot, prompt: np.ndarray, n_common: int) -> int:
        """Make ``slot`` hold KV for prompt[:-1] plus logits for the last token; returns tokens evaluated."""
        n_common = min(n_common, len(prompt) - 1)  # the last token is decoded to get logits
        if not self.ctx.seq_rm(slot.seq, n_common, -1):
            self.ctx.seq_rm(slot.seq, 0, -1)  # cannot truncate here: recompute from scratch
            n_common = 0
        slot.tokens = prompt[:n_common]
        pos = n_common
        while pos < len(prompt):
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
                victim.tokens = victim.tokens[:0]

    def _generate(self, slot: Slot, n_prompt: int, sampler: Sampler, rules: StopRules, on_text,
                  ignore_eog: bool = False):
        """Sample until a stop rule fires; returns (ids, stream, stop_reason, time of first token)."""
        stream = TextStream(rules)
        ids: list[int] = []
        row = self.batch.raw.n_tokens - 1
        stop_tokens = self.template.stop_tokens
        t_first, reason = None, "max_tokens"
        while len(ids) < rules.max_tokens:
            tok = sampler.sample(self.ctx, row)
            if t_first is None:
                t_first = time.perf_counter()
            if not ignore_eog and (self.model.is_eog(tok) or tok in stop_tokens):
                reason = "eog"
                break
            ids.append(tok)
            piece = stream.feed(self.model.piece(tok))
            if piece and on_text:
                on_text(piece)
            if stream.stop_reason:
                reason = stream.stop_reason
                break
            if len(ids) >= rules.max_tokens:
                break
            self.batch.clear()
            self.batch.add(tok, n_prompt + len(ids) - 1, slot.seq, logits=True)
            self._decode(slot)
            row = 0
        tail = stream.finish()
        if tail and on_text:
            on_text(tail)
        return ids, stream, reason, t_first
