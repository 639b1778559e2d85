"""The RAM and disk tiers under their MB budgets: make room by moving states one tier down.

Eviction order (``value``): older, less hit, shorter states go first. Budgets
hold at all times: a state enters a tier only after room was made for it.
Under disk pressure a long state with InfiniGen partial keys is first shrunk
to its most-selected cells, then evicted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import stateformat
from ..errors import StateFileError

if TYPE_CHECKING:
    from .store import Entry

MB = 1 << 20


def value(last_used: float, hits: int, n_tokens: int) -> float:
    """Eviction order: older, less hit, shorter states go first."""
    return last_used + 300 * math.log2(1 + hits) + 60 * math.log2(1 + n_tokens / 1024)


class Tiers:
    """Budget logic of :class:`~efim_local.kv.store.StateStore` (mixed in; uses its fields)."""

    def _make_room_ram(self, size: int) -> None:
        budget = self.cfg.ram_mb * MB
        used = self.ram_bytes()
        for e in sorted(self.ram.values(), key=lambda e: value(e.last_used, e.hits, len(e.tokens))):
            if used + size <= budget:
                break
            used -= len(e.payload) + e.tokens.nbytes
            del self.ram[e.id]
            self._write_disk(e)  # one tier down

    def _write_disk(self, e: Entry) -> None:
        size = stateformat.encoded_size(e.tokens, e.payload, self.layout_params)
        if size > self.cfg.disk_mb * MB:
            self.index.remove(e.id, evicted=True)
            return
        self._make_room_disk(size)
        stateformat.write(self.file_of(e.id), e.tokens, e.payload, self.model, self.layout, self.layout_params)
        if e.partial:
            stateformat.write_private(self.partial_of(e.id), e.partial)
        self.index.add(self._row(e, "disk", size), e.tokens)

    def _make_room_disk(self, size: int) -> None:
        budget = self.cfg.disk_mb * MB
        rows = self.index.rows("disk")
        used = sum(r["bytes"] for r in rows)
        for r in sorted(rows, key=lambda r: value(r["last_used"], r["hits"], r["n_tokens"])):
            if used + size <= budget:
                break
            if r["kept"] >= 1 and self._shrink(r):  # keep its partial form instead
                new = self.index.get(r["id"])
                used -= r["bytes"] - new["bytes"]
                if used + size <= budget:
                    break
                r = new
            used -= r["bytes"]
            self._unlink(r["id"])
            self.index.remove(r["id"], evicted=True)
            self.counts["evicted_disk"] += 1

    def _shrink(self, row: dict) -> bool:
        """Rewrite a long disk state with only its most-selected cells; False if it does not apply."""
        if (not self.cfg.shrink_to or self.shrink is None or row["n_tokens"] < self.cfg.shrink_min_tokens
                or not self.partial_of(row["id"]).exists()):
            return False
        try:
            _, toks, payload = stateformat.read(self.file_of(row["id"]), self.model, self.layout)
        except (StateFileError, OSError):
            return False
        out = self.shrink(payload, self.load_partial(row["id"]), self.selected.get(row["id"]))
        if out is None:
            return False
        payload, partial = out
        self._unlink(row["id"])
        size = stateformat.write(self.file_of(row["id"]), toks, payload, self.model, self.layout, self.layout_params)
        if partial:
            stateformat.write_private(self.partial_of(row["id"]), partial)
        self.index.add({**row, "bytes": size, "kept": self.cfg.shrink_to}, toks)
        self.counts["shrunk_disk"] += 1
        return True

    def spill(self) -> int:
        """Write every RAM state to disk (before the process exits). Returns how many were written
        (a full or read-only disk writes none, with one warning)."""
        n = 0
        for e in list(self.ram.values()):
            del self.ram[e.id]
            n += self._try("save", lambda e: self._write_disk(e) or 1, e) or 0
        return n
