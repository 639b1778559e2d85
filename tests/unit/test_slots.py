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


def test_growth_takes_a_slot_cut_to_a_marker_before_the_least_recently_used():
    """Growth that shares only the FIM marker with every slot cut one to that marker (touching it),
    then took the least recently used slot the next time: the plan it had just finished there, which
    the next keystroke was to adopt, and which it then computed again (CI's riding test caught it)."""
    m = SlotManager(3, min_reuse=16)
    m.slots[0].tokens, m.slots[0].path, m.slots[0].last_used = np.arange(1, 300, dtype=np.int32), "/w/a.py", 1.0
    m.slots[1].tokens, m.slots[1].path, m.slots[1].last_used = np.array([1], dtype=np.int32), "/w/a.py", 3.0
    m.slots[2].tokens, m.slots[2].path, m.slots[2].last_used = np.arange(1, 120, dtype=np.int32), "/w/a.py", 2.0
    full = np.array([1, 500, 501, 502], dtype=np.int32)  # another plan of the same file
    assert m.pick(full, None) == (m.slots[1], 1)  # idle work (no path)
    assert m.pick(full, "/w/a.py") == (m.slots[1], 1)
    assert m.spare(exclude={2}) is m.slots[1]  # where growth copies a keystroke's slot to grow it (Reuse.fork)


def test_a_copy_for_idle_work_never_evicts_a_file_used_since():
    """Issue 39: growth's copy took the least recently used other slot, though its file was used after
    the file growing (then every slot ended up holding the growing file). Its own slot, an empty one
    or a file used before it are taken; else there is no spare (growth goes on in place)."""
    m = SlotManager(3, min_reuse=16)
    m.slots[0].tokens, m.slots[0].path, m.slots[0].used = np.arange(1, 300, dtype=np.int32), "/w/big.py", 1.0
    m.slots[1].tokens, m.slots[1].path, m.slots[1].used = np.arange(1, 40, dtype=np.int32), "/w/a.py", 2.0
    m.slots[2].tokens, m.slots[2].path, m.slots[2].used = np.arange(1, 40, dtype=np.int32), "/w/b.py", 3.0
    assert m.spare(exclude={0}, path="/w/big.py", used=1.0) is None  # a.py and b.py were used since
    assert m.spare(exclude={0}, path="/w/big.py", used=2.5) is m.slots[1]  # a.py was used before it
    assert m.spare(exclude={0}) is m.slots[1]  # (no file: the least recently used, as before)
    assert m.spare(exclude={1}, path="/w/big.py", used=0.5) is m.slots[0]  # its own copy
    m.slots[2].tokens = np.array([1], dtype=np.int32)  # cut to a marker: nothing lost
    assert m.spare(exclude={0}, path="/w/big.py", used=1.0) is m.slots[2]


def test_a_slot_says_what_runs_in_it_and_a_late_end_leaves_the_next_work_alone():
    """``start`` marks the work running in a slot (a request's makes it busy); ``end`` with that
    work's mark clears it, and a work closed late, after another took the slot, clears nothing."""
    m = SlotManager(2)
    s = m.slots[0]
    grow = s.start("grow", "prefill")
    assert (s.job, s.phase) == ("grow", "prefill") and m.busy == set() and s in m.free()
    request = s.start("request", "prefill")  # (the grow work was not closed yet)
    assert m.busy == {0} and m.free() == [m.slots[1]]
    s.end(grow)  # its late end
    assert (s.job, m.busy) == ("request", {0})
    s.end(request)
    assert (s.job, s.phase, m.busy) == (None, "idle", set())
