"""Slots: the llama context's sequences, and the tokens whose KV each holds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..kv.prefix import common_prefix

EMPTY = np.zeros(0, np.int32)
HELD = ("request", "keystroke")  # the jobs other work never picks, evicts or empties a slot under


@dataclass
class Slot:
    seq: int
    tokens: np.ndarray = field(default_factory=lambda: EMPTY)  # KV held for positions 0..len-1
    last_used: float = 0.0  # when work last ran in it
    used: float = 0.0  # when the user last used its file (a request, an open, an edit), as of that run
    path: str | None = None  # the document it last served
    dirty: bool = False  # holds KV not yet saved to the state store
    checkpoint: int = 0  # sliding-window models: the length worth saving (the prompt's head)
    n_prompt: int | None = None  # where the last generation's tokens start (a saved state stops there)
    sparse: bool = False  # holds a sparse (approximate) restore: never saved, never reused exactly
    idle: bool = False  # last decoded by idle work (growth, prefill): its tail is the work's own to cut
    # The logits that follow a prompt whose KV it held, and that prompt (Decoder.kept_logits)
    logits: tuple[np.ndarray, np.ndarray] | None = None
    # Its state (the engine thread's): the work running in it (a request's, a keystroke's answer, the
    # trail "ahead", "grow", "warm", "repo", "calibrate"; None: none) and where that work is: "idle",
    # "prefill" (prompt batches) or "generate" (a token at a time)
    job: str | None = None
    phase: str = "idle"
    owner: object = None  # the work's own mark (``start``)

    def start(self, job: str, phase: str) -> object:
        """Work ``job`` runs in the slot from now, in ``phase``; its mark, for ``end``."""
        self.job, self.phase, self.owner = job, phase, object()
        return self.owner

    def end(self, owner: object) -> None:
        """The work that ``start`` gave ``owner`` ended, however it ended (a work closed late, after
        another took the slot, leaves that one's state alone)."""
        if owner is self.owner:
            self.job, self.phase, self.owner = None, "idle", None

    def touch(self, path: str | None, used: float | None = None) -> None:
        """Work ran in the slot for ``path`` now, whose user last used it at ``used`` (None: now)."""
        self.last_used = time.monotonic()
        self.used = self.last_used if used is None else used
        self.path = path

    def reset(self) -> None:
        self.tokens, self.dirty, self.sparse, self.idle = self.tokens[:0], False, False, False
        self.n_prompt, self.logits = None, None


class SlotManager:
    """Chooses the slot with the longest common token prefix, then the least recently used.

    A match shorter than ``min_reuse`` tokens (say, just the FIM marker) is
    not worth evicting another file's KV for: an empty or the least recently
    used slot is taken instead.
    """

    def __init__(self, n_slots: int, min_reuse: int = 16):
        self.slots = [Slot(seq=i) for i in range(n_slots)]
        self.min_reuse = min_reuse

    @property
    def busy(self) -> set[int]:
        """The slots requests are running in (``HELD``): other work between their steps (growth, another
        request) never picks, evicts or empties them."""
        return {s.seq for s in self.slots if s.job in HELD}

    def free(self) -> list[Slot]:
        """The slots no request is running in."""
        return [s for s in self.slots if s.job not in HELD]

    def pick(self, tokens: np.ndarray, path: str | None = None, busy_ok: bool = False) -> tuple[Slot, int]:
        """The slot to decode ``tokens`` in and how many of them it holds (``busy_ok``: the busy slot
        too, for reading only)."""
        scored = [(common_prefix(s.tokens, tokens), s) for s in (self.slots if busy_ok else self.free())]
        n, slot = max(scored, key=lambda x: (x[0], -x[1].last_used))
        if n < min(self.min_reuse, len(tokens)):
            # The file's own slot first (one file never takes a second slot), then one that holds less
            # than a reuse's worth (idle work cut it to a marker: it is the most recently used, and
            # taking the least recently used instead evicted the plan growth had just finished), then
            # the least recently used.
            n, slot = min(scored, key=lambda x: (path is None or x[1].path != path, *self._loss(x[1])))
        return slot, n

    def spare(self, exclude: set[int], path: str | None = None, used: float | None = None) -> Slot | None:
        """A slot not in ``exclude`` that holds less than a reuse's worth, else the least recently
        used other one (as ``pick``); None when that one holds another file than ``path`` used after
        ``used`` (the file's last use): a copy for a file's idle work never evicts a file in use."""
        others = [s for s in self.free() if s.seq not in exclude]
        spare = min(others, key=self._loss) if others else None
        if (spare is not None and used is not None and spare.path != path and spare.used > used
                and len(spare.tokens) >= self.min_reuse):
            return None
        return spare

    def _loss(self, slot: Slot) -> tuple[bool, float, float]:
        """What taking ``slot`` loses, least first: less than a reuse's worth, then the least recently used
        file (by the user, not by idle work: growth of a file left long ago dated its copies now, so they
        and its next copy evicted the files in use, until every slot held that one file: issue 39), then
        the least recently used slot of it."""
        return len(slot.tokens) >= self.min_reuse, slot.used, slot.last_used

    def lru(self, exclude: set[int]) -> Slot | None:
        """The slot to evict when the KV cache is full: one no work runs in first (a request's never)."""
        cands = [s for s in self.free() if s.seq not in exclude and len(s.tokens)]
        return min(cands, key=lambda s: (s.job is not None, s.used, s.last_used)) if cands else None
