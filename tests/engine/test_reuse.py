"""The reuse seam: typed hit and miss events, counted by the store and reported."""

import logging
import os

from efim_local.engine import CompletionRequest, Engine
from efim_local.kv import StoreConfig

from ..helpers import small_config

DOC = "import os\n\n\ndef walk(top):\n    for root, dirs, files in os.walk(top):\n        yield root\n" * 12


def test_same_text_planned_into_other_tokens_is_a_tokenization_miss(tmp_path, tiny_model, caplog):
    """The content hash saved with each state tells 'tokenization_differs' from 'no_state', and the
    log says which file, and why."""
    caplog.set_level(logging.INFO, "efim")  # (a routine miss: said at INFO, the daemon's log level)
    sc = StoreConfig(tmp_path / "kv", ram_mb=0, disk_mb=64, min_tokens=16)
    cur = DOC.index("yield")
    with Engine(small_config(), tiny_model, store=sc) as e:  # the GGUF's FIM tokens
        e.complete(CompletionRequest(DOC, cur, path="walk.py"))
    # The same document with text markers: the saved tokens cannot serve it, and the store says why.
    with Engine(small_config(fim_template="<PRE>,<SUF>,<MID>"), tiny_model, store=sc) as e:
        out = e.complete(CompletionRequest(DOC, cur, path="walk.py"))
        assert out.cache_tier == "none"
        other = e.complete(CompletionRequest(DOC.replace("walk", "scan"), cur, path="scan.py"))
        assert other.cache_tier == "none"
        misses = e.store.stats()["misses"]
        assert misses["tokenization_differs"] == 1 and misses["no_state"] == 2, misses
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "no saved state restored" in r.getMessage()]
    assert said == [("INFO", "walk.py: no saved state restored: the same text was saved, planned into other tokens (an "
                    "anchor that moved: this version starts cold, its own state is saved)")]


def test_a_state_in_another_process_ram_is_no_corrupt_state(tmp_path, tiny_model, caplog):
    """Two processes share a store (a daemon and `efim complete --no-daemon`): a row of the other's
    RAM tier is not a corrupt file (counted as one before, with no log line to say why)."""
    sc = StoreConfig(tmp_path / "kv", ram_mb=64, disk_mb=64, min_tokens=16)
    cur = DOC.index("yield")
    with Engine(small_config(), tiny_model, store=sc) as a:
        a.complete(CompletionRequest(DOC, cur, path="a.py"))
        a.flush()  # its state in its RAM tier, and in the index the two share
        with a.store.index.db.conn:  # as another process's (alive: this test's parent) RAM row
            a.store.index.db.execute("UPDATE states SET owner = ? WHERE tier = 'ram'", [os.getppid()])
        with Engine(small_config(), tiny_model, store=sc) as b:
            b.complete(CompletionRequest(DOC, cur, path="a.py"))
            assert b.store.stats()["misses"]["corrupt"] == 0
    assert "corrupt" not in caplog.text


def test_hits_per_tier_are_counted_and_reported(tmp_path, tiny_model):
    sc = StoreConfig(tmp_path / "kv", ram_mb=64, disk_mb=64, min_tokens=16)
    cur = DOC.index("yield")
    with Engine(small_config(n_slots=1), tiny_model, store=sc) as e:
        e.complete(CompletionRequest(DOC, cur, path="a.py"))  # miss: nothing saved yet
        e.complete(CompletionRequest(DOC, cur, path="a.py"))  # the live slot
        e.complete(CompletionRequest(DOC.replace("os", "sys"), cur, path="b.py"))  # evicts a.py's slot to RAM
        ram = e.complete(CompletionRequest(DOC, cur, path="a.py"))
        assert ram.cache_tier == "ram" and ram.tokens.evaluated <= 2
        st = e.status()["store"]
        assert st["hits"]["slot"] >= 1 and st["hits"]["ram"] == 1 and st["misses"]["no_state"] == 2
        assert {"sparse_restores", "shrunk_disk", "evicted_disk", "dropped"} <= set(st)


def test_riding_growth_takes_a_marker_slot_without_saving_it(tmp_path, tiny_model):
    """Growth cut a slot to the shared marker, and the next growth step takes that slot first
    (SlotManager.pick). It was marked dirty, so a step riding along a request (``light``: it never
    saves) was cancelled there, step after step, until an idle save. A slot too short to save is
    never dirty."""
    import numpy as np

    from efim_local.engine.reuse import Start
    from efim_local.errors import Cancelled

    sc = StoreConfig(tmp_path / "kv", ram_mb=64, disk_mb=64, min_tokens=16)
    with Engine(small_config(n_slots=2), tiny_model, store=sc) as e:
        e.complete(CompletionRequest(DOC, DOC.index("yield"), path="a.py"))  # a plan worth keeping, in a slot
        plan = next(s for s in e.slots.slots if len(s.tokens))
        marker = next(s for s in e.slots.slots if s is not plan)
        e.reuse.decoder.prefill(marker, plan.tokens[:2], 0)  # the marker, as growth cut to it leaves a slot
        e.reuse.finish(Start(marker, 0, "none"), "a.py", 1, None, cold=False, idle=True)
        assert not marker.dirty and plan.dirty  # (the plan, not saved yet, stays dirty)
        other = np.concatenate([plan.tokens[:1], np.arange(200, 240, dtype=np.int32)])  # another plan of a.py
        try:
            start = e.reuse.start(other, "a.py", False, idle=True, light=True)
        except Cancelled:
            raise AssertionError("riding growth was cancelled on the marker slot") from None
        assert start.slot is marker and start.n_common == 1
