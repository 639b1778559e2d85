"""Instant answers: type-through, accept and a content cache (issue 24).

A greedy generation leaves its KV in the slot and its tokens in a *trail* (``Shown.ids``): the
continuation of its prompt, as far as it is known. At temperature 0 that continuation is a function
of the prompt's tokens alone, so:

- **Type-through**: a keystroke that types the next characters of the answer is answered from the
  trail. Its plan is *defined* as the earlier prompt plus the trail's tokens the typed text covers
  (the middle's tokens are then the earlier middle plus those ids); a token the typed text splits
  is healed (the plan backs it off, and the answer spells the typed part of it first). The same
  plan computed cold gives the same greedy tokens: the answer takes them without decoding, and the
  slot already holds their KV (0 prompt tokens evaluated). It stops by the request's own rules.
- **Accept**: taking the whole answer (or a word, a line) is typing it at once. While the answer is
  shown, background work (:meth:`Trail.ahead_steps`) extends the trail from the KV's end, so the next
  completion after an accept is known when the request comes. A word accepted leaves the KV as it
  is: what follows the word is the same sequence, exactly.
- **Cache**: answers by content (the model's fingerprint, the plan's tokens, the text healed, the
  options that shape the output), shared by every editor and the CLI of one daemon. An entry keeps
  its plan's tokens, compared whole before it is served.

Every answer says where it came from (``Completion.source``).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..errors import Cancelled
from ..kv.prefix import common_prefix
from ..prompt import healing
from ..request import CompletionRequest, Options
from .completion import Completion, Prompt, TokenCounts

CACHE_ENTRIES = 256
OUTPUT_OPTIONS = ("temperature", "top_k", "top_p", "seed", "stop_at_newline", "max_lines", "ignore_eog", "type_over")


@dataclass(eq=False)
class Shown:
    """A file's latest answer: the document it answered, the tokens it decoded, and the greedy
    continuation after them (``ids``; it may end with the end-of-generation token)."""

    text: str
    cursor: int
    prompt: np.ndarray
    heal: bytes  # text backed off the prompt that the continuation spells first
    closers: str
    ids: list[int] = field(default_factory=list)
    answer: str = ""  # the text answered
    n_answer: int = 0  # its tokens
    max_tokens: int = 0
    checkpoint: int = 0  # where the plan's middle starts (what a state save keeps)
    context: dict = field(default_factory=dict)
    accepted: bool = False  # the editor said it took some of it
    keystroke: bool = False  # begun at its keystroke, before the request (Runner.keystroke_steps)


@dataclass
class Through:
    """A keystroke answered from a :class:`Shown`: the plan's tokens, the text it heals, the known
    continuation, whether it was an accept, and the closers after the cursor that the keys left."""

    tokens: np.ndarray
    heal: bytes
    known: list[int]
    source: str
    shown: Shown
    closers: str = ""


def model_key(path) -> str:
    """A model's identity for the cache, without hashing the file (the daemon keeps one model)."""
    try:
        st = os.stat(path)
        return f"{os.path.realpath(path)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return str(path)


class Instant:
    """The latest answer of each file and the answer cache (the engine thread only)."""

    def __init__(self, model, fingerprint: str, ends, size: int = CACHE_ENTRIES):
        """``ends(token)``: whether a token ends a generation."""
        self.model, self.fingerprint, self.ends = model, fingerprint, ends
        self.shown: dict[str, Shown] = {}
        self.cache: OrderedDict[bytes, tuple] = OrderedDict()
        self.size = size

    # -- type-through and accept ---------------------------------------------------------------
    def match(self, req: CompletionRequest) -> Through | None:
        """The type-through plan of ``req``, if it types on the last answer of its file."""
        s = self.shown.get(req.path)
        how = req.how
        if s is None or how.temperature > 0 or how.ignore_eog:
            return None
        c, text = s.cursor, req.text
        n = req.cursor - c
        over = len(s.text) + n - len(text)  # closers the keys typed over (the editor's, or an answer's)
        if n < 0 or (n == 0 and not s.keystroke) or not 0 <= over <= min(n, len(s.closers)) \
                or not text.startswith(s.text[:c]) or text[req.cursor:] != s.text[c + over:]:
            return None  # (the very text and cursor: only the answer begun at its keystroke)
        typed = text[c:req.cursor]
        covered = s.heal + typed.encode("utf-8", "surrogatepass")
        pos = k = 0
        for tok in s.ids:
            piece = self.model.piece(tok)
            if self.ends(tok) or pos + len(piece) > len(covered):
                break
            if covered[pos:pos + len(piece)] != piece:
                return None
            pos, k = pos + len(piece), k + 1
        rest = covered[pos:]
        if rest and (k >= len(s.ids) or self.ends(s.ids[k]) or not self.model.piece(s.ids[k]).startswith(rest)):
            return None  # typed past what is known, or off it
        tokens = np.concatenate([s.prompt, np.asarray(s.ids[:k], dtype=np.int32)])
        source = "keystroke" if n == 0 else "accept" if s.accepted or typed == s.answer else "type-through"
        return Through(tokens, rest, list(s.ids[k:]), source, s, s.closers[over:])

    def note_accepted(self, path: str) -> None:
        """The editor took some of ``path``'s answer: the next keystroke is an accept."""
        s = self.shown.get(path)
        if s is not None:
            s.accepted = True

    def remember(self, path: str, shown: Shown) -> Shown:
        """``shown`` is ``path``'s latest answer (its trail fills as it is generated)."""
        self.shown[path] = shown
        return shown

    @staticmethod
    def answered(s: Shown, out: Completion) -> None:
        s.answer, s.n_answer = out.text, len(out.token_ids)

    def forget(self, path: str) -> None:
        self.shown.pop(path, None)

    # -- the cache ------------------------------------------------------------------------------
    def key(self, prompt: Prompt, how: Options, max_tokens: int) -> bytes:
        h = hashlib.sha256(self.fingerprint.encode())
        h.update(np.asarray(prompt.tokens, dtype=np.int32).tobytes())
        h.update(b"\0" + prompt.heal + b"\0" + prompt.closers.encode("utf-8", "surrogatepass"))
        h.update(repr((max_tokens, *(getattr(how, f) for f in OUTPUT_OPTIONS))).encode())
        return h.digest()

    def get(self, key: bytes, prompt: Prompt) -> tuple | None:
        """A cached answer for exactly this plan: (text, stop reason, ids, trail, layout, context, replaces)."""
        hit = self.cache.get(key)
        if hit is None or hit[0] != prompt:  # the plan itself, compared whole
            return None
        self.cache.move_to_end(key)
        return hit[1:]

    def put(self, key: bytes, prompt: Prompt, out: Completion, trail: list[int]) -> None:
        if self.size <= 0:
            return
        self.cache[key] = (prompt, out.text, out.stop_reason, list(out.token_ids), list(trail), out.layout,
                           dict(out.context), out.replaces)
        self.cache.move_to_end(key)
        while len(self.cache) > self.size:
            self.cache.popitem(last=False)

    def clear(self) -> None:
        self.cache.clear()
        self.shown.clear()


def cached_completion(hit: tuple, prompt: Prompt) -> Completion:
    """The completion a cache hit answers (nothing decoded)."""
    text, reason, ids, _, layout, context, replaces = hit
    n = len(prompt.tokens)
    # nothing from the KV (cached 0, cache_tier none), nothing evaluated
    return Completion(text=text, stop_reason=reason, layout=layout, source="cache", context=dict(context),
                      replaces=replaces, tokens=TokenCounts(prompt=n, cached=0, evaluated=0, generated=len(ids)),
                      token_ids=list(ids), prompt=prompt)


def heal_left(model, s: Shown) -> bytes:
    """The text healed that the trail has not spelled out yet (the next tokens must spell it)."""
    rest = s.heal
    for tok in s.ids:
        if not rest:
            break
        rest = healing.left_after(rest, model.piece(tok))
    return rest


class Trail:
    """The greedy continuation of a file's answer while it is shown, extended in idle time; its
    engine builds it and owns it (``engine.trail``)."""

    def __init__(self, engine):
        self.engine = engine

    def ahead_steps(self, path: str, should_stop=None, limit: int | None = None, typed: int | None = None):
        """Extend ``path``'s trail from the KV's end while its answer is shown (background steps, one
        token each): the next completion after an accept is then known. Up to the answer's length plus
        the request's max_tokens, or the end of generation. ``limit``: at most so many tokens past
        ``typed``, the trail's tokens the user typed (default: the answer's), and while the file's plan
        is reduced at most ``Policy.ahead_reduced`` (a cancelled answer's trail, a keystroke's: the
        next ghost's first tokens; the rest of the time goes to the context). An answer's own
        continuation has no limit: an accept is answered from it. Nothing when the slot lost the KV."""
        engine = self.engine
        s = engine.instant.shown.get(path) if engine.instant is not None else None
        if s is None or not engine.backend.local_kv:  # replicas: the trail is the server's
            return

        target = min(s.n_answer + s.max_tokens, engine.config.context.n_ctx_seq - len(s.prompt) - 1)
        if limit is not None:
            if engine.reduced(path):  # growth has work (and a stage of it forgets this trail)
                limit = min(limit, engine.policy.ahead_reduced)
            # (counted from what is typed, not from the trail's end: a restarted task, or each key, would add it)
            target = min(target, (s.n_answer if typed is None else typed) + limit)
        if len(s.ids) >= target or (s.ids and engine.instant.ends(s.ids[-1])):
            return
        slot, _ = engine.slots.pick(np.concatenate([s.prompt, np.asarray(s.ids, dtype=np.int32)]))
        if not keep_known(engine.ctx, slot, s.prompt, s.ids):
            return
        slot.touch(path, engine.reuse.used(path))  # (dated by the file's last use: SlotManager._loss)
        heal = heal_left(engine.model, s)  # an answer cancelled before it spelled out the text healed
        owner = slot.start("ahead", "generate")
        greedy = engine.decoder.greedy
        try:
            while len(s.ids) < target:
                if should_stop is not None and should_stop():
                    raise Cancelled()
                row = engine.decoder.logits_after(slot, s.prompt, s.ids)
                if heal:  # as the decoder picks them (decode.py): the same trail as the answer's own
                    tok = healing.pick(engine.ctx.logits(row), engine.decoder.healer.allowed(heal))
                    heal = healing.left_after(heal, engine.model.piece(tok))
                else:
                    tok = greedy.sample(engine.ctx, row)
                s.ids.append(tok)
                if engine.instant.ends(tok):
                    return
                yield "ahead"
        finally:
            slot.end(owner)


def keep_known(ctx, slot, prompt: np.ndarray, known) -> bool:
    """Whether ``slot`` holds all of ``prompt`` (then its KV is cut to what it holds of ``prompt`` +
    ``known``: generation goes on from there, no prompt token evaluated; ``ctx``: the slot's context)."""
    want = np.concatenate([prompt, np.asarray(known, dtype=np.int32)]) if len(known) else prompt
    n = common_prefix(slot.tokens, want)
    if n < len(prompt) or slot.sparse:
        return False
    if n < len(slot.tokens):
        if not ctx.seq_rm(slot.seq, n, -1):
            return False
        slot.tokens = slot.tokens[:n]
    return True
