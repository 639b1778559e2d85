"""The reuse seam: which KV a request starts from, and saving what a slot holds.

A request's prompt starts from the best of: the live slot with the longest
common token prefix, a saved state in the RAM or disk tier (restored whole or
cut to the shared prefix), or an InfiniGen sparse restore of a long saved
state (opt-in, approximate). Every request records one typed event
(:class:`~efim_local.kv.events.Hit` or :class:`~efim_local.kv.events.Miss`)
that the store counts.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from ..errors import Cancelled, Unsupported
from ..kv import Hit, Miss, StateStore, kvblob
from ..kv.prefix import common_prefix
from .decode import Decoder
from .files import Files
from .slots import Slot, SlotManager

# Misses that count a problem (kv/events.py), with the cause said in the log (the file's name with it).
PROBLEMS = {"corrupt": "its state file was bad and has been dropped (the line above says why)",
            "tokenization_differs": "the same text was saved, planned into other tokens (an anchor that moved: "
                                    "this version starts cold, its own state is saved)"}
log = logging.getLogger("efim.kv")


@dataclass
class Start:
    """Where a request's prompt starts: ``slot`` holds KV for ``prompt[:n_common]``."""

    slot: Slot
    n_common: int
    tier: str  # slot | ram | disk | none
    sparse: dict | None = None  # the sparse restore's report, or why it fell back
    same: bool = False  # the slot already held exactly this prompt


def content_hash(text: str | None) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest() if text else ""


class Reuse:
    """Owns slot choice, restores from the store and saves into it (the engine thread only)."""

    def __init__(self, ctx, slots: SlotManager, decoder: Decoder, files: Files, store: StateStore | None,
                 sparse=None, n_stream: int = 1, swa: bool = False):
        self.ctx, self.slots, self.decoder, self.files = ctx, slots, decoder, files
        self.store, self.sparse, self.n_stream, self.swa = store, sparse, n_stream, swa
        self.policy = decoder.policy  # the engine's (restore_min_gain: tokens a restore must save)

    def start(self, prompt: np.ndarray, path: str | None, want_sparse: bool, cold: bool = False,
              idle: bool = False, light: bool = False, keep: np.ndarray | None = None) -> Start:
        """Choose the slot for ``prompt`` and bring in the best KV for it. ``cold`` ignores all of it;
        ``idle`` work never cuts the KV a slot holds beyond the shared prefix (see fork()), nor, its
        own, what a slot holds of ``keep``. ``light`` work (growth between a request's tokens) never
        saves or restores a state: Cancelled when it would have to save one."""
        if idle and not cold:
            self.fork(prompt, path, light, keep)
        # Idle work that shares little with the file's slot takes another: growing there would cut the
        # keystrokes' KV (and the next keystroke would cut the growth).
        slot, n_common = self.slots.pick(prompt, None if idle else path)
        if slot.sparse and (not want_sparse or cold):  # approximate KV never serves an exact request
            self.clear(slot)
            n_common = 0
        # The same prompt again leaves the KV as it was: nothing new to save (what was generated
        # after it is kept too: the next keystroke may type through it).
        same = n_common == len(prompt) <= len(slot.tokens)
        if slot.dirty and (slot.path != path or n_common < self.slots.min_reuse):
            # The slot is about to serve another file or plan: keep its state. Saving replaces the
            # file's older states, but not the one this prompt restores below (the budget counted it).
            restores = None if cold or light or self.store is None else self.store.lookup(prompt, path).match
            self._save_unless(light, slot, keep=restores.id if restores is not None else None)
        slot.touch(path, self.used(path))  # it serves this file from now (status; finish touches it again)
        if cold:
            return Start(slot, 0, "none", same=same)
        tier = "slot" if n_common >= self.slots.min_reuse else "none"
        if self.store is None or light:
            return Start(slot, n_common, tier, same=same)
        start = self._from_store(slot, prompt, n_common, tier, path, want_sparse)
        start.same = same
        return start

    def _save_unless(self, light: bool, slot: Slot, keep: str | None = None) -> None:
        if light:
            raise Cancelled()  # no state serialized between a request's tokens: idle time will do it
        self.save(slot, keep)

    def fork(self, prompt: np.ndarray, path: str | None, light: bool = False,
             keep: np.ndarray | None = None) -> None:
        """Copy the longest prefix of ``prompt`` a slot holds into a spare slot, if that slot holds
        more (the keystrokes' KV): idle work then grows the copy, and a request that comes in the
        meantime still finds its own KV whole. Without this, every keystroke would cut off what the
        idle work had grown since the last one."""
        src, n = self.slots.pick(prompt, busy_ok=True)  # a copy only reads the source
        # A source that holds no more than the shared prefix, or whose rest is this file's idle work's
        # own (the typed text of an earlier growth step), is grown in place, unless a request is
        # generating in it, or its rest is ``keep``'s (growth's progress past a stage it refreshes).
        own = src.idle and src.path == path and (keep is None or common_prefix(src.tokens, keep) <= n)
        holds_more = (n < len(src.tokens) and not own) or src.seq in self.slots.busy
        if self.swa or src.sparse or n < self.slots.min_reuse or not holds_more or n + 1 >= len(prompt):
            return
        # (No spare but a file used since this one's last use: growth goes on in place, at the cost of
        # this file's keystroke KV, not of a file in use.)
        # Never into a slot that holds more of ``keep`` than the source shares: growth's progress past the
        # stage it refreshes (growth riding along a request lost it so when the request took the stage)
        ahead = set() if keep is None else {s.seq for s in self.slots.slots if common_prefix(s.tokens, keep) > n}
        spare = self.slots.spare(exclude={src.seq, *ahead}, path=path, used=self.used(path))
        if spare is None:
            return
        if spare.dirty:
            self._save_unless(light, spare)
        self.clear(spare)
        self.ctx.seq_cp(src.seq, spare.seq)  # whole sequences: llama.cpp copies across streams only so
        self.ctx.seq_rm(spare.seq, n, -1)
        spare.tokens = src.tokens[:n].copy()
        # A copy across KV streams is only carried out by the next decode: do one now (the next token
        # of the idle work), so that no save or restore of this slot can see it half done.
        self.decoder.prefill(spare, prompt[:n + 1], n)
        spare.path, spare.checkpoint, spare.dirty = path, src.checkpoint, False
        # (Of two equal matches pick() takes the older: this one.)
        spare.last_used, spare.used = src.last_used - 1e-3, src.used

    def used(self, path: str | None) -> float | None:
        """When the user last used ``path`` (a request, an open, an edit: ``FileState.used``), None
        for a path the engine does not know (then now)."""
        f = self.files.get(path) if path else None
        return f.used if f is not None else None

    def drop_others(self, path: str, prompt: np.ndarray) -> None:
        """Empty the slots of ``path`` that share less than all of ``prompt`` (a plan superseded by
        the grown one): one file, one live slot."""
        for slot in self.slots.free():
            if slot.path == path and len(slot.tokens) and common_prefix(slot.tokens, prompt) < len(prompt):
                self.clear(slot)

    def peek(self, prompt: np.ndarray, busy_ok: bool = False) -> int:
        """How many of ``prompt``'s tokens a live slot already holds (no side effects; ``busy_ok``:
        a slot a request is running in counts too: it keeps its prompt's KV when it ends)."""
        return self.slots.pick(prompt, busy_ok=busy_ok)[1]

    def stored(self, prompt: np.ndarray, path: str | None):
        """``cached(tokens)``: how many of ``tokens`` a request would start with, counting the saved
        state (RAM or disk tier) that shares the longest prefix with ``prompt`` as ``start`` restores
        it (only where it beats the live slots by ``policy.restore_min_gain``, cut before the last token);
        None when there is none. A restore takes milliseconds, so the latency budget counts it as
        cached (``Runner.fit_budget``)."""
        if self.store is None or self.swa:  # (a sliding-window state cannot be cut)
            return None
        m = self.store.lookup(prompt, path).match  # (whole states only: a shrunk one is approximate)
        if m is None or m.n < self.policy.restore_min_gain:
            return None

        def cached(tokens: np.ndarray) -> int:
            live, saved = self.peek(tokens), min(common_prefix(m.tokens, tokens), len(tokens) - 1)
            return saved if saved >= live + self.policy.restore_min_gain else live
        return cached

    def finish(self, start: Start, path: str | None, n_prompt: int, checkpoint: int | None, cold: bool,
               idle: bool = False) -> None:
        """After decoding: keep the KV of the prompt (as far as it was decoded) and of the output
        (``slot.tokens``: a keystroke that types the suggestion on continues from it)."""
        slot = start.slot
        slot.idle = idle
        if not self.ctx.seq_rm(slot.seq, len(slot.tokens), -1):
            self.clear(slot)
        slot.touch(path, self.used(path))  # (idle work: its file's last use, not now; SlotManager._loss)
        # (A slot too short to save is never dirty: growth cut to a marker would otherwise make the
        # next riding step that picks it save first, which riding growth never does: it would stall.)
        slot.dirty = (self.store is not None and len(slot.tokens) >= self.store.cfg.min_tokens and not slot.sparse
                      and (slot.dirty or not start.same or cold))
        ck = checkpoint if checkpoint is not None else n_prompt - 1
        slot.checkpoint = max(0, min(ck, n_prompt - 1, len(slot.tokens)))
        slot.n_prompt = n_prompt

    def clear(self, slot: Slot) -> None:
        """Empty a slot (its KV and its record)."""
        self.ctx.seq_rm(slot.seq, 0, -1)
        slot.reset()

    # -- restoring --------------------------------------------------------------------------
    def _from_store(self, slot: Slot, prompt: np.ndarray, n_common: int, tier: str, path: str | None,
                    want_sparse: bool) -> Start:
        """Restore a saved state into ``slot`` if it beats what the slot holds."""
        store = self.store
        keep = Start(slot, n_common, tier)
        if n_common + self.policy.restore_min_gain >= len(prompt):
            store.record(Hit("slot"))
            return keep
        f = self.files.get(path) if path else None
        found = store.lookup(prompt, path, content_hash=lambda: content_hash(f.current if f else None),
                             shrunk=want_sparse and self.sparse is not None)
        m = found.match
        if m is None or m.n < n_common + self.policy.restore_min_gain:
            miss = Miss(found.miss_reason or "no_state")
            if tier != "slot" and miss.reason in PROBLEMS:  # a counter that counts a problem says where, and why
                # (a moved anchor is routine: the state that is saved next serves it; a bad file is not)
                level = logging.WARNING if miss.reason == "corrupt" else logging.INFO
                log.log(level, "%s: no saved state restored: %s", path, PROBLEMS[miss.reason])
            store.record(Hit("slot") if tier == "slot" else miss)
            return keep
        n = len(m.tokens) if self.swa else min(m.n, len(prompt) - 1)
        if n >= len(prompt):  # a whole sliding-window state as long as the prompt: nothing left to decode
            store.record(Hit("slot") if tier == "slot" else Miss("no_state"))
            return keep
        payload = store.load(m, n)
        if payload is None:  # the state file was bad and has been dropped; the slot is untouched
            store.record(Miss("corrupt"))
            return keep
        report = None
        if m.kept < 1 or (want_sparse and n >= (self.sparse.min_tokens if self.sparse else 0)):
            report = self._sparse_restore(slot, prompt, n, m, payload)
            if "fallback" not in report:
                store.record(Hit(m.tier, sparse=True))
                return Start(slot, n, m.tier, report)
            if m.kept < 1:  # a shrunk state is approximate: never restore it as if it were whole
                keep.sparse = report
                return keep
        try:
            self.ctx.set_seq_state(slot.seq, kvblob.wrap(payload, self.n_stream))
            # Verify before decoding: the slot must hold exactly positions [0, n).
            ok = self.ctx.seq_pos_max(slot.seq) == n - 1
        except Exception:  # llama.cpp rejected it, or it does not parse
            ok = False
        if ok:
            slot.tokens, slot.dirty = prompt[:n], False
            store.record(Hit(m.tier))
            return Start(slot, n, m.tier, report)
        self.clear(slot)
        store.drop(m.id, "corrupt")
        store.record(Miss("corrupt"))
        return Start(slot, 0, "none", report)

    def _sparse_restore(self, slot: Slot, prompt: np.ndarray, n: int, m, payload: bytes) -> dict:
        """InfiniGen: restore only the cells speculated to matter; {"fallback": reason} if it cannot."""
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
        self.store.note_selection(m.id, self.sparse.restorer.last_positions)
        report["shrunk_state"] = m.kept < 1
        return report

    # -- saving -----------------------------------------------------------------------------
    def save(self, slot: Slot, keep: str | None = None) -> None:
        """Serialize a slot into the store (RAM tier). Sliding-window models save their checkpoint.
        ``keep``: a state of the same file that stays (the store replaces a file's older states)."""
        slot.dirty = False
        if slot.sparse or self.store is None:  # a sparse slot is a subset of a state already stored
            return
        toks = slot.tokens
        # The prompt's KV, not the generated tokens kept after it (a next prompt rarely holds them).
        n = min(slot.checkpoint if self.swa else len(toks), slot.n_prompt or len(toks), len(toks))
        if n < self.store.cfg.min_tokens:
            return
        if n < len(toks):
            self.ctx.seq_rm(slot.seq, n, -1)
            blob = self.ctx.seq_state(slot.seq)
            slot.tokens = toks[:n]
            self.decoder.prefill(slot, toks, n)  # put the rest back
        else:
            blob = self.ctx.seq_state(slot.seq)
        f = self.files.get(slot.path) if slot.path else None
        payload = kvblob.normalize(blob)
        partial = self.sparse.partial_npz(payload) if self.sparse and n >= self.sparse.min_tokens else None
        self.store.put(toks[:n], payload, slot.path or "", content_hash(f.current if f else None), partial, keep)

    def flush(self) -> None:
        """Save dirty slots (after the response was sent, or when idle)."""
        if self.store is None:
            return
        for slot in self.slots.slots:
            if slot.dirty:
                self.save(slot)
        self.store.flush_counts()
