"""Slot choice: the longest common token prefix, and one file never takes a second slot."""

import numpy as np

from efim_local.engine.slots import SlotManager


def test_a_file_whose_prompt_changed_at_the_top_reuses_its_own_slot():
    """Before: a re-anchor that shares fewer than min_reuse tokens took an empty slot, so two slots
    held the same file (and another file's KV was evicted sooner)."""
    m = SlotManager(3, min_reuse=16)
    m.slots[0].tokens, m.slots[0].path, m.slots[0].last_used = np.arange(1, 41, dtype=np.int32), "/w/a.py", 2.0
    m.slots[1].tokens, m.slots[1].path, m.slots[1].last_used = np.arange(100, 140, dtype=np.int32), "/w/b.py", 1.0
    new = np.array([1, 2, 999, 998], dtype=np.int32)
    assert m.pick(new, "/w/a.py") == (m.slots[0], 2)
    slot, n = m.pick(new, "/w/c.py")  # another file takes the empty slot, as before
    assert slot is m.slots[2] and n == 0
    assert m.pick(np.arange(1, 30, dtype=np.int32), "/w/c.py") == (m.slots[0], 29)  # a long match wins
