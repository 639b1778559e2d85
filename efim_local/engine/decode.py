"""Decoding into a slot: prefill the missing prompt tokens, then sample until a stop rule fires."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..errors import Cancelled, Interrupted, NoKvSlot
from ..llama import Batch, Context, Model, Sampler, SamplerParams
from ..prompt import healing
from ..prompt.healing import Healer
from . import drafts
from .policy import Policy
from .slots import Slot, SlotManager
from .steps import drive
from .stream import StopRules, TextStream


BEFORE_PEEK = 96  # prompt tokens before the cursor read for the cursor's line and the lines above it
ABOVE = 3  # lines above the cursor an answer must not repeat

# What a step of work yields: which kind of step it was (the scheduler picks the next by it).
PREFILL = "prefill"  # a prompt batch was decoded; more follow
TOKEN = "token"  # a token was sampled, no text shown yet
SHOWN = "shown"  # a token was sampled and some text went out


@dataclass
class Generated:
    ids: list[int]
    stream: TextStream
    reason: str
    t_first: float | None


@dataclass(frozen=True)
class Links:
    """What the decoder asks of its engine. ``observe(n_new, n_ctx, ms)`` learns from every prefill
    batch (the latency budget's speed); ``predict_ms(n_new, n_ctx)``: the learned speed, ms or None
    (when a batch will end); ``fit()``: called before every decode (automatic threads follow the
    load: engine/cpu.py); ``markers``: the FIM markers that locate the suffix for drafts (drafts.py),
    which ``free_cores()`` (free, all) caps."""

    observe: Callable | None = None
    predict_ms: Callable | None = None
    fit: Callable | None = None
    markers: object = None
    free_cores: Callable | None = None


class Decoder:
    """Drives ``llama_decode`` for one slot at a time (the engine thread only)."""

    def __init__(self, model: Model, ctx: Context, batch: Batch, slots: SlotManager, stop_tokens: frozenset[int],
                 policy: Policy | None = None, links: Links = Links(), drafting: bool = True):
        """``policy``: the drafts' knobs and the clock that times batches (the speed, interrupts);
        ``links``: what it asks of its engine; ``drafting``: whether greedy generations verify drafts."""
        self.policy = Policy() if policy is None else policy
        self.clock = self.policy.clock
        self.model, self.ctx, self.batch, self.slots = model, ctx, batch, slots
        self.stop_tokens = stop_tokens
        # The greedy sampler every greedy generation shares (stateless: no chain per request); its
        # engine's ExitStack frees it (else it is freed when collected)
        self.greedy = Sampler()
        self.observe, self.fit, self.predict_ms = links.observe, links.fit, links.predict_ms
        self.interruptible = False  # background work's prompt batches: a request stops them mid-batch
        self.batch_span: tuple[float, float] | None = None  # (start, expected end) of the interruptible batch
        # A request came late in a batch: the next interruptible batch stops at once. One writer each: the
        # waking thread counts its asks (ask_stop_next), the engine thread the asks it has seen (arm).
        self._stops_asked = 0
        self._stops_seen = 0
        self._healer: Healer | None = None
        # Drafts (drafts.py): greedy generations verify drafted tokens in batches; the FIM markers
        # locate the suffix (its rejoin text ends an answer, drafted or not); free_cores() caps drafts.
        self.drafting = drafting
        self.markers, self.free_cores = links.markers, links.free_cores
        self.draft_stats = drafts.DraftStats(self.policy)

    @property
    def stop_next(self) -> bool:
        """Whether the next interruptible batch stops at once (asked since background work was armed)."""
        return self._stops_asked != self._stops_seen

    def ask_stop_next(self) -> None:
        """(The waking thread, holding the scheduler's lock.) The next interruptible batch stops at once."""
        self._stops_asked += 1

    def arm(self) -> None:
        """(The engine thread, holding the scheduler's lock.) Background work starts: the asks so far
        are past."""
        self._stops_seen = self._stops_asked

    def draft(self, on: bool) -> None:
        """Whether greedy generations verify drafts from now on (``efim bench drafts`` compares both)."""
        self.drafting = on

    def batches_interruptible(self, on: bool) -> None:
        """(The engine thread.) While ``on`` (background work runs), prompt batches stop at an interrupt
        (llama.cpp's abort flag, or an ask to stop the next), the asks so far past."""
        self.interruptible = on
        if on:
            self.arm()
            self.ctx.clear_interrupt()

    def sampler(self, params: SamplerParams):
        """A generation's sampler, as a context manager: the shared greedy one at temperature 0, else
        a chain of its own, freed at the block's end."""
        return nullcontext(self.greedy) if params.temperature <= 0 else Sampler(params)

    @property
    def healer(self) -> Healer:
        if self._healer is None:  # built on first use: it reads the whole vocabulary
            self._healer = Healer.of_model(self.model)
        return self._healer

    def prefill(self, slot: Slot, prompt: np.ndarray, n_common: int, should_stop=None, chunk=None) -> int:
        """Make ``slot`` hold KV for prompt[:-1] plus logits for the last token; returns tokens evaluated.
        The steps of :meth:`prefill_steps`, run to the end."""
        return drive(self.prefill_steps(slot, prompt, n_common, should_stop, chunk))

    def prefill_steps(self, slot: Slot, prompt: np.ndarray, n_common: int, should_stop=None, chunk=None):
        """:meth:`prefill` one batch per step: yields between batches of at most ``chunk`` tokens (an
        int, or a function of the context so far; default: the batch size), returns the tokens
        evaluated. ``should_stop()`` is polled before each batch; when true, Cancelled is raised and
        the slot keeps what was decoded so far. The last batch (whose logits the first sample reads)
        is never followed by a yield: another step would overwrite its logits."""
        n_common = min(n_common, len(prompt) - 1)  # the last token is decoded to get logits
        if not self.ctx.seq_rm(slot.seq, n_common, -1):
            self.ctx.seq_rm(slot.seq, 0, -1)  # cannot truncate here: recompute from scratch
            n_common = 0
        slot.tokens = prompt[:n_common]
        pos = n_common
        while pos < len(prompt):
            if pos > n_common:
                yield PREFILL
                if len(slot.tokens) != pos:  # evicted meanwhile (Decoder.decode, for a request): start again later
                    raise Cancelled()
            if should_stop is not None and should_stop():
                raise Cancelled()
            step = chunk(pos) if callable(chunk) else chunk or self.batch.capacity
            part = prompt[pos:pos + min(step, self.batch.capacity)]
            self.batch.clear()
            self.batch.extend(part, pos, slot.seq)
            if pos + len(part) == len(prompt):
                self.batch.raw.logits[len(part) - 1] = True
            t = self.clock()
            if self.interruptible:
                if self.stop_next:
                    self.ctx.interrupt()
                ms = self.predict_ms(len(part), pos) if self.predict_ms is not None else None
                self.batch_span = (t, t + ms / 1e3) if ms else None
            try:
                self.decode(slot, self.interruptible)  # interrupted: slot.tokens still says what it holds
            finally:
                self.batch_span = None
            if self.observe is not None:
                self.observe(len(part), pos, (self.clock() - t) * 1e3)
            pos += len(part)
            slot.tokens = prompt[:pos]
        return len(prompt) - n_common

    def ends(self, tok: int) -> bool:
        """Whether ``tok`` ends a generation: end of generation, the template's stop token, or any other
        special token (an Instruct model's chat markers: a middle never holds one)."""
        return ends(self.model, self.stop_tokens, tok)

    def decode(self, slot: Slot, interruptible: bool = False) -> None:
        """Decode the batch; on a full KV cache evict other slots (LRU first) and retry.
        ``interruptible`` (background work's batches): a request stops it (Interrupted, with the
        seconds of work dropped with the batch)."""
        if self.fit is not None:
            self.fit()
        t = time.perf_counter()
        while True:
            try:
                return self.ctx.decode(self.batch, interruptible)
            except Interrupted as e:
                e.lost_s = time.perf_counter() - t
                raise
            except NoKvSlot:
                victim = self.slots.lru(exclude={slot.seq})
                if victim is None:
                    raise
                self.ctx.seq_rm(victim.seq, 0, -1)
                victim.reset()

    def generate(self, slot: Slot, prompt: np.ndarray, sampler: Sampler, spec: "GenSpec",
                 logits_ready: bool = True) -> Generated:
        """Sample until a stop rule fires; the steps of :meth:`generate_steps`, run to the end."""
        return drive(self.generate_steps(slot, prompt, sampler, spec, logits_ready))

    def generate_steps(self, slot: Slot, prompt: np.ndarray, sampler: Sampler, spec: "GenSpec",
                       logits_ready: bool = True, kept: np.ndarray | None = None):
        """Sample until a stop rule fires, one token per step; returns a :class:`Generated`.

        ``logits_ready``: the last batch decoded ``prompt``'s last token (a prefill just ended);
        otherwise the slot holds KV for a prefix of ``prompt`` + ``spec.known`` and the logits are
        computed when a token must be sampled (``kept``: the first token's logits, kept from an
        earlier run on the same prompt: :meth:`kept_logits`). The tokens of ``spec.known`` are taken as they are
        (no decode): they are the greedy continuation, known already. Decoded tokens are recorded in
        ``slot.tokens`` (the KV stays for the next keystroke, which may type through them).

        It yields ``TOKEN`` after each sampled token that is not the last, before decoding it: the
        logits it read are used, so the scheduler may decode other slots then. It yields ``SHOWN``
        instead once some text went out (work that rides along waits for the first text). Known
        tokens cost nothing: no step ends after them."""
        heal, known, trail = spec.heal, spec.known, spec.trail
        suffix = drafts.find_suffix(prompt, self.markers)
        rules = answer_rules(self.model, self.markers, spec.rules, prompt, heal, suffix)
        stream = TextStream(rules)
        ids: list[int] = []
        row = self.batch.raw.n_tokens - 1 if logits_ready else None
        t_first, reason, shown = None, "max_tokens", False
        drafter = self.drafter(prompt, suffix, sampler)
        ready: list[int] = []  # greedy tokens a verified draft gave, not taken yet
        while len(ids) < rules.max_tokens:
            computed = len(ids) >= len(known)
            if not computed:
                tok = known[len(ids)]
            elif ready:
                tok = ready.pop(0)
            elif kept is not None:  # (no decode: the slot holds the prompt, these logits follow it)
                tok = healing.pick(kept, self.healer.allowed(heal)) if heal else int(np.argmax(kept))
                kept = None
            elif row is None and drafter is not None and not heal and (draft := drafter.propose(ids)):
                t = self.clock()
                ready = drafts.verify(self, slot, prompt, ids, draft)
                drafter.taken(len(ids), len(draft), len(ready) - 1, self.clock() - t)
                tok = ready.pop(0)
            else:
                if row is None:
                    t = self.clock()
                    row = self.logits_after(slot, prompt, ids)
                    if drafter is not None and self.batch.raw.n_tokens == 1:
                        self.draft_stats.plain(self.clock() - t)  # one token decoded: the cost to beat
                if not ids and sampler.params.temperature <= 0 and not slot.sparse:
                    # The next run on this prompt (the next keystroke's, mid-word: the same prompt, the
                    # partial word backed off) samples from these logits instead of decoding its last token again.
                    logits = self.ctx.logits(row)
                    slot.logits = (prompt, logits)
                    tok = healing.pick(logits, self.healer.allowed(heal)) if heal else int(np.argmax(logits))
                else:
                    tok = (healing.pick(self.ctx.logits(row), self.healer.allowed(heal)) if heal
                           else sampler.sample(self.ctx, row))
            row = None  # read: the next token needs this one decoded
            raw = self.model.piece(tok)
            if heal:  # the token must agree with the backed-off text
                raw, heal = (raw[len(heal):], b"") if raw.startswith(heal) else (b"", heal[len(raw):])
            if trail is not None and len(trail) == len(ids):
                trail.append(tok)  # the greedy continuation, for the next keystroke
            if t_first is None:
                t_first = time.perf_counter()
            if not spec.ignore_eog and self.ends(tok):
                reason = "eog"
                break
            ids.append(tok)
            piece = stream.feed(raw)
            if piece and spec.on_text:
                spec.on_text(piece)
            shown = shown or bool(piece) or spec.on_text is None
            if stream.stop_reason:
                reason = stream.stop_reason
                break
            if len(ids) >= rules.max_tokens:
                break
            if spec.should_stop is not None and spec.should_stop():
                raise Cancelled(data={"first_token_at": t_first, "generated": len(ids)})
            if computed and not ready:  # a verified draft is one step
                yield SHOWN if shown else TOKEN
                if spec.should_stop is not None and spec.should_stop():
                    raise Cancelled(data={"first_token_at": t_first, "generated": len(ids)})
        tail = stream.finish()
        if tail and spec.on_text:
            spec.on_text(tail)
        if trail is not None and len(trail) == len(ids) and reason != "eog":
            for tok in ready:  # verified past the stop: more of the greedy continuation, for free
                trail.append(tok)
                if self.ends(tok):
                    break
        if ids:
            self.draft_stats.history.append(np.asarray(ids, dtype=np.int32))
        return Generated(ids, stream, reason, t_first)

    def kept_logits(self, slot: Slot, prompt: np.ndarray) -> np.ndarray | None:
        """The logits that follow ``prompt``, kept by the slot's last greedy run on it, when the slot
        still holds all of it (its KV is then cut to the prompt); None otherwise. They are what decoding
        the prompt's last token again would give (the same tokens at the same positions)."""
        kept = slot.logits
        if (kept is None or slot.sparse or len(kept[0]) != len(prompt) or len(slot.tokens) < len(prompt)
                or not np.array_equal(kept[0], prompt) or not np.array_equal(slot.tokens[:len(prompt)], prompt)):
            return None
        if len(slot.tokens) > len(prompt):
            if not self.ctx.seq_rm(slot.seq, len(prompt), -1):
                return None
            slot.tokens = slot.tokens[:len(prompt)]
        return kept[1]

    def drafter(self, prompt: np.ndarray, suffix: np.ndarray, sampler: Sampler) -> "drafts.Drafter | None":
        """The drafts of a greedy generation (None: sampling, or drafting is off)."""
        if not self.drafting or sampler.params.temperature > 0:
            return None
        free, cores = self.free_cores() if self.free_cores is not None else (1, 1)
        most = self.policy.max_draft
        cap = most if free >= cores else max(2, most // 2)
        return drafts.Drafter(prompt, suffix, self.draft_stats.history, cap, self.draft_stats)

    def held(self, slot: Slot, prompt: np.ndarray, ids: list[int]) -> tuple[np.ndarray, int]:
        """``prompt`` + ``ids``, and how many of them the slot holds, at most all but the last (KV
        held beyond is cut: the last token's logits are wanted)."""
        n = len(prompt) + len(ids)
        have = min(len(slot.tokens), n - 1)
        if have < len(slot.tokens):
            if not self.ctx.seq_rm(slot.seq, have, -1):
                self.ctx.seq_rm(slot.seq, 0, -1)
                have = 0
            slot.tokens = slot.tokens[:have]
        return (np.concatenate([prompt, np.asarray(ids, dtype=np.int32)]) if ids else prompt), have

    def logits_after(self, slot: Slot, prompt: np.ndarray, ids: list[int]) -> int:
        """Decode what the slot lacks of ``prompt`` + ``ids`` (at least its last token, whose logits
        are wanted: KV held beyond is cut); returns the logits' row in the batch."""
        seq, have = self.held(slot, prompt, ids)
        n = len(seq)
        while have < n:
            part = seq[have:have + self.batch.capacity]
            self.batch.clear()
            self.batch.extend(part, have, slot.seq)
            if have + len(part) == n:
                self.batch.raw.logits[len(part) - 1] = True
            self.decode(slot, self.interruptible)  # background work's (the continuation computed ahead)
            have += len(part)
            slot.tokens = seq[:have]
        return self.batch.raw.n_tokens - 1


def ends(model, stop_tokens: frozenset[int], tok: int) -> bool:
    """Whether ``tok`` ends a generation (Decoder.ends)."""
    return model.is_eog(tok) or tok in stop_tokens or model.is_control(tok)


def answer_rules(model, markers, rules: StopRules, prompt: np.ndarray, heal: bytes = b"",
                 suffix: np.ndarray | None = None) -> StopRules:
    """``rules`` with the stops that the prompt's text gives (a function of the prompt alone, so an
    answer ends in the same place whatever KV it was served from): where the output rejoins the
    suffix (``drafts.rejoin_text``), and where it leaves the block it started in or repeats the lines
    above the cursor (stream.py ``_block_cut``; from the prompt's tokens before the cursor and the
    text healed)."""
    if markers is None or rules.line is not None:
        return rules
    text = lambda toks: b"".join(model.piece(int(t)) for t in toks)
    suffix = drafts.find_suffix(prompt, markers) if suffix is None else suffix
    rejoin = rules.rejoin or drafts.rejoin_text(text(suffix[:drafts.SUFFIX_PEEK]).decode("utf-8", "replace"))
    before = (text(drafts.find_before(prompt, markers)[-BEFORE_PEEK:]) + heal).decode("utf-8", "replace")
    lines = before.split("\n")
    above = [ln.strip() for ln in lines[1:-1] if ln.strip()]  # (the first may be cut short)
    return replace(rules, rejoin=rejoin, line=lines[-1], above=tuple(above[-ABOVE:]))


@dataclass
class GenSpec:
    """How a generation runs: its stop ``rules``; ``on_text`` receives the text shown;
    ``should_stop()`` cancels (Cancelled) between tokens; ``heal`` is text backed off the prompt that
    the first tokens must spell out again; ``known`` is the greedy continuation already known (from
    an earlier generation on the same tokens, temperature 0 only); ``trail`` receives every token
    determined (the end-of-generation token too): the next keystroke's known continuation."""

    rules: StopRules
    on_text: Callable[[str], None] | None = None
    ignore_eog: bool = False
    should_stop: Callable[[], bool] | None = None
    heal: bytes = b""
    known: Sequence[int] = ()
    trail: list[int] | None = None
